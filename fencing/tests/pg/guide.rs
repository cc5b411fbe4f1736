//! The snippets of docs/POSTGRES.md (and README.md's psql transcript), run as written, so that
//! the guide cannot drift from the package. Every fenced block carries a marker on the line
//! before it, which says how it is run:
//!
//! - `<!-- tested: psql as ROLE -->`: SQL, as ROLE (`migrator`, the installing role; `app`, a
//!   writer; `app_owner`, the protected tables' owner); it must raise no error;
//! - `<!-- tested: sh -->`: each command (continuation lines joined) — `fence-gateway` and
//!   `psql` run, each must exit 0; commands that start services (`warehouse`, `lease-proxy`,
//!   `python3 …`) have their flags checked against their definitions instead; flags in a
//!   trailing `# [...]` comment are checked too;
//! - `<!-- tested: transcript as ROLE -->` (`, terse`: `\set VERBOSITY terse`): what `psql -q -a`
//!   prints for the block's input lines (those ending in `;` or starting with `\`) must be the
//!   block, line for line (trailing spaces aside).
//!
//! All of it in one `psql` process, in the documents' order, on a scratch database: the roles the
//! guide names are mapped onto the scratch's, its placeholders (`postgres://migrator:…@db/app`,
//! `'v1.k1.0.4711.…'`, `fencing.key`) onto real values.

use std::collections::HashMap;
use std::path::Path;

/// One fenced block and how it is run.
#[derive(Debug, Clone)]
pub struct Block {
    /// `docs/POSTGRES.md:123`, for messages.
    pub at: String,
    pub kind: Kind,
    pub text: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    Psql { role: String },
    Sh,
    Transcript { role: String, terse: bool },
}

/// The fenced blocks of the document at `path` (relative to the repository), with their
/// markers: every block, panicking on one without a marker (`all`), or the marked ones only.
pub fn blocks(path: &str, all: bool) -> Vec<Block> {
    let doc = std::fs::read_to_string(Path::new("..").join(path)).unwrap();
    let lines: Vec<&str> = doc.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        if !lines[i].starts_with("```") || lines[i].len() == 3 {
            i += 1;
            continue;
        }
        let at = format!("{path}:{}", i + 1);
        let marker = i
            .checked_sub(1)
            .and_then(|j| lines[j].strip_prefix("<!-- tested: "))
            .and_then(|m| m.strip_suffix(" -->"));
        let end = (i + 1..lines.len())
            .find(|&j| lines[j] == "```")
            .unwrap_or_else(|| panic!("{at}: unterminated block"));
        let Some(marker) = marker else {
            assert!(
                !all,
                "{at}: a snippet without a `<!-- tested: … -->` marker"
            );
            i = end + 1;
            continue;
        };
        let text = lines[i + 1..end].join("\n");
        out.push(Block {
            kind: kind(marker, &at),
            at,
            text,
        });
        i = end + 1;
    }
    out
}

fn kind(marker: &str, at: &str) -> Kind {
    if marker == "sh" {
        return Kind::Sh;
    }
    if let Some(role) = marker.strip_prefix("psql as ") {
        return Kind::Psql {
            role: role.to_owned(),
        };
    }
    if let Some(rest) = marker.strip_prefix("transcript as ") {
        let (role, terse) = match rest.strip_suffix(", terse") {
            Some(role) => (role, true),
            None => (rest, false),
        };
        return Kind::Transcript {
            role: role.to_owned(),
            terse,
        };
    }
    panic!("{at}: unknown marker {marker:?}")
}

/// The values the guide's names and placeholders stand for.
pub struct Values {
    /// Role names of the guide → roles of the scratch database.
    pub roles: HashMap<&'static str, String>,
    /// Exact strings → their replacement (URLs, token literals).
    pub strings: Vec<(&'static str, String)>,
}

impl Values {
    /// `text` with every placeholder and every role name in a role's place replaced.
    pub fn apply(&self, text: &str) -> String {
        let mut text = text.to_owned();
        for (from, to) in &self.strings {
            text = text.replace(from, to);
        }
        // Words and the whitespace between them, kept as they are.
        let mut pieces: Vec<&str> = Vec::new();
        let mut start = 0;
        for (i, c) in text.char_indices() {
            let boundary =
                i > start && c.is_whitespace() != text[start..].starts_with(char::is_whitespace);
            if boundary {
                pieces.push(&text[start..i]);
                start = i;
            }
        }
        pieces.push(&text[start..]);
        let words: Vec<usize> = (0..pieces.len())
            .filter(|&i| !pieces[i].starts_with(char::is_whitespace))
            .collect();
        let mut out: Vec<String> = pieces.iter().map(|p| (*p).to_owned()).collect();
        for (k, &i) in words.iter().enumerate() {
            let before = k.checked_sub(1).map(|j| pieces[words[j]]).unwrap_or("");
            let after = words.get(k + 1).map(|&j| pieces[j]).unwrap_or("");
            let role_place = ["--owner", "--writer", "--gateway-role", "ROLE", "TO"]
                .contains(&before)
                || (before == "GRANT" && after == "TO");
            let (name, tail) = split_tail(pieces[i]);
            if let (true, Some(role)) = (role_place, self.roles.get(name)) {
                out[i] = format!("{role}{tail}");
            }
        }
        out.concat()
    }
}

/// `name;` → (`name`, `;`), for a role name followed by punctuation or a quote.
fn split_tail(token: &str) -> (&str, &str) {
    let end = token
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(token.len());
    token.split_at(end)
}

/// The commands of a shell block: continuation lines joined, comments and blank lines left out,
/// each with the flags of its trailing `# [...]` comment, if any.
pub fn commands(block: &str) -> Vec<(String, Vec<String>)> {
    let mut out = Vec::new();
    let mut current = String::new();
    let mut optional = Vec::new();
    for line in block.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('#') || trimmed.is_empty() {
            continue;
        }
        let (code, comment) = match trimmed.split_once(" #") {
            Some((code, comment)) => (code.trim_end(), Some(comment)),
            None => (trimmed, None),
        };
        if let Some(comment) = comment {
            optional.extend(flags(comment));
        }
        match code.strip_suffix('\\') {
            Some(code) => {
                current.push_str(code.trim_end());
                current.push(' ');
            }
            None => {
                current.push_str(code);
                out.push((current.trim().to_owned(), std::mem::take(&mut optional)));
                current.clear();
            }
        }
    }
    out
}

/// The `--flags` of a command line.
pub fn flags(text: &str) -> Vec<String> {
    text.split(|c: char| c.is_whitespace() || c == '[' || c == ']' || c == '=')
        .filter(|w| w.starts_with("--") && w.len() > 2)
        .map(str::to_owned)
        .collect()
}

/// The input lines of a `psql -a` transcript: those ending in `;` or starting with `\`.
pub fn transcript_input(block: &str) -> String {
    block
        .lines()
        .filter(|l| l.ends_with(';') || l.starts_with('\\'))
        .map(|l| format!("{l}\n"))
        .collect()
}

/// `text`'s lines, trailing spaces removed, for comparing transcripts.
pub fn trimmed(text: &str) -> Vec<String> {
    text.lines().map(|l| l.trim_end().to_owned()).collect()
}

/// The psql script that runs `blocks` (appended to the caller's preamble): each block after an
/// `\echo @@ N` line, as the role `session_role` maps its marker's role to; a shell block's
/// `fence-gateway pg`/`psql` commands through `\!`, its services' flags checked at once (and the
/// optional flags of `fence-gateway pg SUB` against `help(SUB)`), failures into `failures`.
pub fn script(
    blocks: &[Block],
    values: &Values,
    session_role: impl Fn(&str) -> String,
    help: impl Fn(&str) -> String,
    failures: &mut Vec<String>,
) -> String {
    let mut script = String::new();
    for (n, block) in blocks.iter().enumerate() {
        match &block.kind {
            Kind::Psql { role } => {
                script += &format!(
                    "\\c - {}\n\\echo @@ {n}\n{}\n",
                    session_role(role),
                    values.apply(&block.text)
                );
            }
            Kind::Sh => {
                script += &format!("\\echo @@ {n}\n");
                for (command, optional) in commands(&block.text) {
                    let command = values.apply(&command);
                    if command.starts_with("\"$FENCE_GATEWAY\" pg ") || command.starts_with("psql ")
                    {
                        for flag in &optional {
                            let sub = command.split(' ').nth(2).unwrap_or_default();
                            if !help(sub).contains(flag.as_str()) {
                                failures.push(format!(
                                    "{}: `fence-gateway pg {sub}` has no {flag}",
                                    block.at
                                ));
                            }
                        }
                        script += &format!("\\! {command}; echo \"exit $?\"\n");
                    } else {
                        check_service_flags(&command, &optional, failures);
                    }
                }
            }
            Kind::Transcript { role, terse } => {
                script += &format!("\\c - {}\n", session_role(role));
                if *terse {
                    script += "\\set VERBOSITY terse\n";
                }
                script += &format!(
                    "\\echo @@ {n}\n{}\\echo @@ end\n\\set VERBOSITY default\n",
                    transcript_input(&block.text)
                );
            }
        }
    }
    script
}

/// Judges each block by its section of psql's output (after its `@@ N` line).
pub fn verdicts(blocks: &[Block], output: &str, failures: &mut Vec<String>) {
    let lines: Vec<&str> = output.lines().collect();
    for (n, block) in blocks.iter().enumerate() {
        let start = lines
            .iter()
            .position(|l| *l == format!("@@ {n}"))
            .unwrap_or_else(|| panic!("{}: never ran:\n{output}", block.at));
        let section: Vec<&str> = lines[start + 1..]
            .iter()
            .take_while(|l| !l.starts_with("\\echo @@"))
            .copied()
            .collect();
        let said = section.join("\n");
        match &block.kind {
            Kind::Transcript { .. } if trimmed(&said) != trimmed(&block.text) => {
                failures.push(format!("{}: psql printed\n{said}\n", block.at));
            }
            Kind::Psql { .. } | Kind::Sh
                if said.contains("ERROR")
                    || said
                        .lines()
                        .any(|l| l.starts_with("exit ") && l != "exit 0") =>
            {
                failures.push(format!("{}: failed:\n{said}\n", block.at));
            }
            _ => {}
        }
    }
}

/// A service's command line from the guide: its flags exist where the service defines them.
pub fn check_service_flags(command: &str, optional: &[String], failures: &mut Vec<String>) {
    let flags: Vec<String> = flags(command)
        .into_iter()
        .chain(optional.iter().cloned())
        .collect();
    let source = |path: &str| std::fs::read_to_string(Path::new("..").join(path)).unwrap();
    let defined: Box<dyn Fn(&str) -> bool> = if command.starts_with("warehouse inventory ") {
        let src = source("examples/src/bin/warehouse/inventory.rs");
        Box::new(move |flag: &str| src.contains(&format!("    {}: ", flag[2..].replace('-', "_"))))
    } else if command.starts_with("lease-proxy ") {
        let doc = lease_proxy_testkit::docs::read("docs/CONFIGURATION.md");
        let table = lease_proxy_testkit::docs::table_flags(&lease_proxy_testkit::docs::section(
            &doc,
            "## lease-proxy",
        ));
        Box::new(move |flag: &str| table.contains(flag))
    } else if let Some(script) = command.strip_prefix("python3 ") {
        let path = script.split(' ').next().unwrap_or_default().to_owned();
        let src = source(&path);
        Box::new(move |flag: &str| src.contains(&format!("\"{flag}\"")))
    } else {
        failures.push(format!("no way to check the flags of `{command}`"));
        return;
    };
    for flag in flags {
        if !defined(&flag) {
            failures.push(format!("`{command}`: {flag} is not one of its flags"));
        }
    }
}
