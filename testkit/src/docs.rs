//! The documents' tables, read so that tests can hold them to the code: the flag tables of
//! `docs/CONFIGURATION.md` against a binary's `--help`, and the problem tables of `docs/API.md`
//! against the problem types an OpenAPI document lists.
#![allow(clippy::unwrap_used)] // a test helper: a missing document must stop the test loudly

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// The repository's root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A document of the repository (`docs/API.md`, …), read whole.
pub fn read(path: &str) -> String {
    std::fs::read_to_string(repo().join(path))
        .unwrap_or_else(|e| panic!("{path} cannot be read: {e}"))
}

/// The lines under the heading `heading` (given with its `#`s), up to the next heading of the
/// same or a higher level; fenced code blocks are kept as they are.
pub fn section(doc: &str, heading: &str) -> String {
    let level = heading.chars().take_while(|&c| c == '#').count();
    let mut lines = doc.lines().skip_while(|l| l.trim_end() != heading);
    assert!(lines.next().is_some(), "no heading {heading:?}");
    lines
        .take_while(|l| {
            let hashes = l.chars().take_while(|&c| c == '#').count();
            !(hashes > 0 && hashes <= level && l[hashes..].starts_with(' '))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// A table row's cells, split on `|` outside code spans.
pub fn cells(row: &str) -> Vec<String> {
    let mut cells = vec![String::new()];
    let mut in_code = false;
    let inner = row.trim().trim_start_matches('|').trim_end_matches('|');
    for c in inner.chars() {
        if c == '`' {
            in_code = !in_code;
        }
        if c == '|' && !in_code {
            cells.push(String::new());
        } else {
            cells.last_mut().unwrap().push(c);
        }
    }
    cells.iter().map(|c| c.trim().to_owned()).collect()
}

/// The body rows of every table in `text` (header rows and rules left out), as cells.
pub fn table_rows(text: &str) -> Vec<Vec<String>> {
    let lines: Vec<&str> = text.lines().collect();
    let is_rule = |l: &str| {
        l.trim_start().starts_with('|')
            && cells(l)
                .iter()
                .all(|c| !c.is_empty() && c.chars().all(|c| matches!(c, '-' | ':')))
    };
    let mut rows = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let in_table = line.trim_start().starts_with('|') && !is_rule(line);
        let is_header = lines.get(i + 1).is_some_and(|next| is_rule(next));
        if in_table && !is_header {
            rows.push(cells(line));
        }
    }
    rows
}

/// The code spans of a piece of Markdown.
pub fn code_spans(text: &str) -> Vec<&str> {
    text.split('`').skip(1).step_by(2).collect()
}

/// Every long flag (`--name`) that appears in `text`.
pub fn flags_in(text: &str) -> BTreeSet<String> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
        .filter(|w| w.len() > 2 && w.starts_with("--") && !w.starts_with("---"))
        .map(str::to_owned)
        .collect()
}

/// The long flags a binary's `--help` defines (not those its descriptions mention).
pub fn help_flags(binary: &Path) -> BTreeSet<String> {
    let out = Command::new(binary).arg("--help").output().unwrap();
    assert!(out.status.success(), "{} --help: {out:?}", binary.display());
    let mut flags = BTreeSet::new();
    for line in String::from_utf8(out.stdout).unwrap().lines() {
        let line = line.trim_start();
        if !line.starts_with('-') {
            continue;
        }
        for word in line.split([' ', ',']).filter(|w| !w.is_empty()) {
            match word.chars().next() {
                Some('-') => {
                    let name: String = word
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                        .collect();
                    if name.starts_with("--") {
                        flags.insert(name);
                    }
                }
                Some('<' | '[') => {}
                _ => break, // the description begins
            }
        }
    }
    flags
}

/// The long flags named in the first cell of the flag tables of `section_text`.
pub fn table_flags(section_text: &str) -> BTreeSet<String> {
    table_rows(section_text)
        .iter()
        .flat_map(|row| code_spans(&row[0]).into_iter().flat_map(flags_in))
        .collect()
}

/// The (slug, status) pairs of a problem table: slugs are the code spans of the first cell,
/// statuses the numbers of the second (`502 / 504` pairs with two slugs in order; one status
/// goes with every slug of its row).
pub fn problem_table(section_text: &str) -> BTreeSet<(String, u16)> {
    let mut out = BTreeSet::new();
    for row in table_rows(section_text) {
        let slugs = code_spans(&row[0]);
        let statuses: Vec<u16> = row
            .get(1)
            .map(|c| c.split(['/', ' ']).filter_map(|s| s.parse().ok()).collect())
            .unwrap_or_default();
        for (i, slug) in slugs.iter().enumerate() {
            let status = if statuses.len() == slugs.len() {
                statuses[i]
            } else {
                statuses.first().copied().unwrap_or(0)
            };
            out.insert(((*slug).to_owned(), status));
        }
    }
    out
}

/// The (slug, status) pairs an OpenAPI document lists in its description's problem table (as
/// `runtime::openapi::finish` writes it).
pub fn document_problems(doc: &Value) -> BTreeSet<(String, u16)> {
    let description = doc["info"]["description"].as_str().unwrap_or_default();
    table_rows(description)
        .iter()
        .filter_map(|row| {
            let status = row.first()?.parse().ok()?;
            let uri = *code_spans(row.get(1)?).first()?;
            Some((uri.rsplit('/').next()?.to_owned(), status))
        })
        .collect()
}
