//! The documentation stays true to the tree: README's layout table names every module file of
//! the three crates (`proxy/src/**`, `fencing/src/**`, `runtime/src/**`) and nothing that is gone, and every relative
//! link between the Markdown files resolves — to a file, and to a heading when it names one — and no
//! comment or document cites the tracker's history (issue numbers, reviewers, long-file notes).
//!
//! The checks read the tree and the documents as they are (no list of modules is kept here), so
//! moving, adding or removing a module fails the first until its row says so. The flag table of
//! docs/CONFIGURATION.md is held to `lease-proxy --help` here (fence-gateway's in `fencing`'s
//! tests), the problem tables of docs/API.md to the OpenAPI documents in the `openapi` tests.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use lease_proxy_testkit::docs;

fn repo() -> PathBuf {
    docs::repo().canonicalize().unwrap()
}

/// The crates' source folders whose every `.rs` file the layout table must name.
const CRATE_SOURCES: [&str; 3] = ["proxy/src", "fencing/src", "runtime/src"];

/// Every file under `dir` (relative to the repository), recursively.
fn files_under(root: &Path, dir: &str, out: &mut BTreeSet<String>) {
    for entry in std::fs::read_dir(root.join(dir)).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().into_string().unwrap();
        let path = format!("{dir}/{name}");
        if entry.file_type().unwrap().is_dir() {
            files_under(root, &path, out);
        } else if name.ends_with(".rs") {
            out.insert(path);
        }
    }
}

/// What the layout table names. In a row, the first code span of the first cell is a path from
/// the repository root (a folder ends with `/`); the first cell's further spans are its siblings.
/// Every span ending in `.rs` elsewhere in the row is a file of the row's folder — the path
/// itself for a folder row, the path's folder for a file row. Returns the files named under the
/// crates' sources (with the row naming each) and every path named, which must all exist.
fn layout_names(readme: &str) -> (BTreeMap<String, String>, BTreeSet<String>) {
    let mut files = BTreeMap::new();
    let mut paths = BTreeSet::new();
    for cells in docs::table_rows(&docs::section(readme, "## Layout")) {
        let row = cells.join(" | ");
        let first = docs::code_spans(&cells[0]);
        let Some(head) = first.first() else {
            continue;
        };
        let path = head.trim_end_matches('/');
        let parent = Path::new(path).parent().unwrap();
        let folder = if head.ends_with('/') {
            Path::new(path)
        } else {
            parent
        };
        let mut named: Vec<String> = vec![path.to_owned()];
        named.extend(
            first[1..]
                .iter()
                .map(|s| parent.join(s).to_str().unwrap().to_owned()),
        );
        for cell in &cells[1..] {
            for span in docs::code_spans(cell) {
                if span.ends_with(".rs") && !span.contains(char::is_whitespace) {
                    named.push(folder.join(span).to_str().unwrap().to_owned());
                }
            }
        }
        for path in named {
            if path.ends_with(".rs") && CRATE_SOURCES.iter().any(|s| path.starts_with(s)) {
                files.insert(path.clone(), row.clone());
            }
            paths.insert(path);
        }
    }
    (files, paths)
}

#[test]
fn the_layout_table_names_every_module_and_only_modules_that_exist() {
    let root = repo();
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let (named, paths) = layout_names(&readme);
    let mut present = BTreeSet::new();
    for dir in CRATE_SOURCES {
        files_under(&root, dir, &mut present);
    }
    assert!(present.len() > 20, "found only {present:?}");

    let unnamed: Vec<_> = present.iter().filter(|f| !named.contains_key(*f)).collect();
    let gone: Vec<_> = paths.iter().filter(|p| !root.join(p).exists()).collect();
    assert!(
        unnamed.is_empty() && gone.is_empty(),
        "README.md's layout table is out of date.\n\
         Not named (add each to its folder's row, or a row of its own): {unnamed:#?}\n\
         Named but not in the tree (remove or rename them): {gone:#?}"
    );
}

/// The Markdown files whose links must resolve: every `.md` in the repository except build
/// output and the campaign's prose template (its links are written for where it is rendered,
/// docs/RELIABILITY.md, which is checked).
fn markdown_files(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let path = entry.path();
        let name = entry.file_name().into_string().unwrap();
        if entry.file_type().unwrap().is_dir() {
            let skip = name.starts_with('.')
                || ["target", "node_modules", "venv"].contains(&name.as_str())
                || path == root.join("campaign/doc");
            if !skip {
                markdown_files(root, &path, out);
            }
        } else if name.ends_with(".md") {
            out.push(path);
        }
    }
}

/// The Markdown outside fenced code blocks and code spans.
fn prose(text: &str) -> String {
    let mut out = String::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            let spans_removed: String = line.split('`').step_by(2).collect::<Vec<_>>().join("");
            out.push_str(&spans_removed);
            out.push('\n');
        }
    }
    out
}

/// The targets of inline links `[text](target)` in prose.
fn link_targets(text: &str) -> Vec<String> {
    let prose = prose(text);
    let mut targets = Vec::new();
    let mut rest = prose.as_str();
    while let Some(at) = rest.find("](") {
        rest = &rest[at + 2..];
        if let Some(end) = rest.find(')') {
            let target = rest[..end].split_whitespace().next().unwrap_or("");
            targets.push(target.to_owned());
        }
    }
    targets
}

/// GitHub's anchors for a file's headings: lower case, punctuation dropped except `-` and `_`,
/// spaces turned into `-`, repeats numbered `-1`, `-2`, ….
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        }
        if fenced || !line.starts_with('#') {
            continue;
        }
        let title = line.trim_start_matches('#').trim();
        let slug: String = title
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let n = seen.entry(slug.clone()).or_insert(0);
        out.insert(if *n == 0 {
            slug.clone()
        } else {
            format!("{slug}-{n}")
        });
        *n += 1;
    }
    out
}

#[test]
fn links_between_the_documents_resolve() {
    let root = repo();
    let mut files = Vec::new();
    markdown_files(&root, &root, &mut files);
    assert!(files.iter().any(|f| f.ends_with("docs/ARCHITECTURE.md")));
    let mut broken = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for target in link_targets(&text) {
            if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (path, anchor) = match target.split_once('#') {
                Some((path, anchor)) => (path, Some(anchor)),
                None => (target.as_str(), None),
            };
            let linked = if path.is_empty() {
                file.clone()
            } else {
                file.parent().unwrap().join(path)
            };
            let shown = file.strip_prefix(&root).unwrap().display();
            if !linked.exists() {
                broken.push(format!("{shown}: {target} (no such file)"));
                continue;
            }
            if let Some(anchor) = anchor {
                let linked_text = std::fs::read_to_string(&linked).unwrap_or_default();
                if !anchors(&linked_text).contains(anchor) {
                    broken.push(format!("{shown}: {target} (no such heading)"));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn anchors_follow_githubs_rules() {
    let text = "# lease-proxy, native (`/v1`)\n## Watch streams and etcd's compaction\n## A\n## A\n```\n# not a heading\n```\n";
    let found = anchors(text);
    for expected in [
        "lease-proxy-native-v1",
        "watch-streams-and-etcds-compaction",
        "a",
        "a-1",
    ] {
        assert!(found.contains(expected), "{expected} not in {found:?}");
    }
    assert!(!found.contains("not-a-heading"));
}

#[test]
fn the_configuration_table_lists_exactly_the_flags_of_lease_proxy() {
    let doc = docs::read("docs/CONFIGURATION.md");
    let table = docs::table_flags(&docs::section(&doc, "## lease-proxy"));
    let shared = docs::flags_in(&docs::section(&doc, "## Both binaries"));
    let help = docs::help_flags(Path::new(env!("CARGO_BIN_EXE_lease-proxy")));
    assert!(help.contains("--etcd-endpoints"), "{help:?}");
    let undocumented: Vec<_> = help
        .iter()
        .filter(|f| !table.contains(*f) && !shared.contains(*f))
        .filter(|f| !["--help", "--version"].contains(&f.as_str()))
        .collect();
    let unknown: Vec<_> = table.difference(&help).collect();
    assert!(
        undocumented.is_empty() && unknown.is_empty(),
        "docs/CONFIGURATION.md's lease-proxy table is out of date.\n\
         In --help, not in the table: {undocumented:?}\nIn the table, not in --help: {unknown:?}"
    );
}

/// Where `needle` is followed by a decimal digit (a tracker number after a word).
fn followed_by_digit(line: &str, needle: &str) -> bool {
    line.match_indices(needle).any(|(at, _)| {
        line[at + needle.len()..]
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_digit())
    })
}

/// `over N lines`, N decimal: the apology for a long file that a split should replace.
fn over_n_lines(line: &str) -> bool {
    line.match_indices("over ").any(|(at, _)| {
        let rest = &line[at + "over ".len()..];
        let digits = rest.chars().take_while(char::is_ascii_digit).count();
        digits > 0 && rest[digits..].starts_with(" lines")
    })
}

/// Every source and document a reader meets, outside build output and vendored packages.
fn readable_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let path = entry.path();
        let name = entry.file_name().into_string().unwrap();
        if entry.file_type().unwrap().is_dir() {
            let skip = name.starts_with('.')
                || ["target", "node_modules", "venv", "dist", "__pycache__"]
                    .contains(&name.as_str());
            if !skip {
                readable_files(&path, out);
            }
        } else if ["rs", "md", "py", "go", "ts", "sh", "sql"]
            .iter()
            .any(|ext| name.ends_with(&format!(".{ext}")))
            && !name.starts_with("CHANGELOG")
        {
            out.push(path);
        }
    }
}

/// Code comments and docs keep the *why* and drop the *who and when*: no tracker numbers, no
/// reviewers' names, no "(over N lines)" notes — they point nowhere a reader can follow. The
/// history is in CHANGELOG.md and the commit bodies.
#[test]
fn comments_and_docs_cite_no_tracker_history() {
    let root = repo();
    let mut files = Vec::new();
    for dir in [
        "proxy", "fencing", "runtime", "docs", "campaign", "benches", "testkit", "sdk", "leasectl",
        "examples", "model", "scripts",
    ] {
        if root.join(dir).is_dir() {
            readable_files(&root.join(dir), &mut files);
        }
    }
    files.push(root.join("README.md"));
    // Spelled in two halves so this file does not find itself.
    let pass = format!("{} {}", "hostile", "pass");
    let mut found = Vec::new();
    for file in &files {
        let Ok(text) = std::fs::read_to_string(file) else {
            continue;
        };
        for (n, line) in text.lines().enumerate() {
            let lower = line.to_lowercase();
            if followed_by_digit(&lower, "issue ")
                || followed_by_digit(&lower, "helper-")
                || lower.contains(&pass)
                || over_n_lines(&lower)
            {
                let shown = file.strip_prefix(&root).unwrap_or(file).display();
                found.push(format!("{shown}:{}: {}", n + 1, line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "tracker history in code or docs:\n{}",
        found.join("\n")
    );
}
