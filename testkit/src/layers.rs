//! Imports flow one way (house rule 1a), checked by reading a crate's sources: each top-level
//! module sits in a layer, a module may name its own layer and the layers below it, and no two
//! modules reach each other, directly or round a loop.
//!
//! Every `.rs` file under the crate's `src` is read for the paths it names: `use crate::x…`,
//! grouped `use crate::{x, y::z}`, inline `crate::x::…` (in attributes' strings too), and
//! `super::…` that climbs out of its top-level module; a name re-exported at the crate root
//! (`crate::Error`) counts as the module it comes from (the root's `pub use`). Comment lines are
//! skipped, and so is test code — items under `#[cfg(test)]` (or `cfg(all(test, …))`) and the
//! files of test-only modules: a unit test may drive its module through a higher one (a store's
//! readiness through the gate) without that being a dependency of the library.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The layers of a crate, lowest first: a name and the top-level modules in it (`lib` and
/// `main` for the crate roots).
pub type Table = [(&'static str, &'static [&'static str])];

/// Every way `src` breaks `layers`, one message a line (shown with `shown`, e.g.
/// `fencing/src`, before each file): modules in no layer, imports of a higher layer, and loops
/// between modules.
pub fn problems(src: &Path, shown: &str, layers: &Table) -> Vec<String> {
    problems_apart(src, shown, layers, &[])
}

/// As [`problems`], and the modules of each layer named in `apart` never import one another at
/// all (a crate's fronts, each a thin shell over what sits below them).
pub fn problems_apart(src: &Path, shown: &str, layers: &Table, apart: &[&str]) -> Vec<String> {
    let roots = root_names(&read(&src.join("lib.rs")));
    let mut files = Vec::new();
    rs_files(src, &mut files);
    files.sort();
    let test_files = test_only_files(src, &files);
    let mut problems = Vec::new();
    let mut edges: BTreeMap<(String, String), String> = BTreeMap::new();
    for file in files.iter().filter(|f| !test_files.contains(*f)) {
        let relative = file.strip_prefix(src).unwrap_or(file);
        let module = module_path(relative);
        let own = top_level(relative);
        let at = format!("{shown}/{}", relative.display());
        let Some((own_layer, own_name)) = layer_of(layers, &own) else {
            problems.push(format!(
                "{at}: module `{own}` is in no layer of the layer table"
            ));
            continue;
        };
        let text = without_tests(&code(&read(file)));
        for (line, name) in reached(&text, &module) {
            let target = roots.get(&name).cloned().unwrap_or(name);
            if target == own {
                continue;
            }
            let Some((layer, layer_name)) = layer_of(layers, &target) else {
                continue; // not a module (a macro, `crate::` in a string of prose)
            };
            if layer > own_layer {
                problems.push(format!(
                    "{at}:{line}: `{own}` ({own_name}) imports `{target}` ({layer_name}): a lower layer may not import a higher one"
                ));
            } else if layer == own_layer && apart.contains(&own_name) {
                problems.push(format!(
                    "{at}:{line}: `{own}` imports `{target}`: the modules of {own_name} never import one another"
                ));
            }
            edges
                .entry((own.clone(), target))
                .or_insert_with(|| format!("{at}:{line}"));
        }
    }
    problems.extend(cycles(&edges));
    problems
}

/// The layer of top-level module `module`: its index (0 lowest) and name.
fn layer_of(layers: &Table, module: &str) -> Option<(usize, &'static str)> {
    layers
        .iter()
        .enumerate()
        .find(|(_, (_, modules))| modules.contains(&module))
        .map(|(i, (name, _))| (i, *name))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn rs_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            rs_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module of a file under `src` (`lease/view.rs` → `lease`, `lib.rs` → `lib`).
fn top_level(relative: &Path) -> String {
    let first = relative
        .iter()
        .next()
        .and_then(|p| p.to_str())
        .unwrap_or("");
    first.trim_end_matches(".rs").to_owned()
}

/// The module path of a file under `src` (`lease/mod.rs` → `[lease]`, `lease/view.rs` →
/// `[lease, view]`, `lib.rs` → `[]`).
fn module_path(relative: &Path) -> Vec<String> {
    let mut parts: Vec<String> = relative
        .iter()
        .filter_map(|p| p.to_str())
        .map(|p| p.trim_end_matches(".rs").to_owned())
        .collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    if parts.len() == 1 && (parts[0] == "lib" || parts[0] == "main") {
        parts.clear();
    }
    parts
}

fn identifier(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// The first segments of the paths in a `{…}` group (`a, b::c, d::{e, f}` → a, b, d).
fn group_heads(group: &str) -> Vec<String> {
    let mut heads = Vec::new();
    let mut depth = 0;
    let mut start = true;
    for (i, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => start = true,
            c if start && depth == 0 && !c.is_whitespace() => {
                heads.push(identifier(&group[i..]).to_owned());
                start = false;
            }
            _ => {}
        }
    }
    heads
}

/// The byte just past the `}` matching the `{` at `open` (the end of `text` if none).
fn matching_brace(text: &str, open: usize) -> usize {
    let mut depth = 0;
    for (i, c) in text[open..].char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return open + i + 1;
                }
            }
            _ => {}
        }
    }
    text.len()
}

/// The text between the `{` at `open` and its matching `}`.
fn braced(text: &str, open: usize) -> &str {
    let end = matching_brace(text, open);
    &text[open + 1..end.saturating_sub(1).max(open + 1)]
}

/// The code of a file with comment lines blanked (line numbers kept).
fn code(text: &str) -> String {
    text.lines()
        .map(|l| {
            if l.trim_start().starts_with("//") {
                ""
            } else {
                l
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Whether an attribute line makes what follows test-only: `#[cfg(test)]`,
/// `#[cfg(all(test, …))]` — not `cfg(not(test))` nor `cfg(any(test, …))`.
fn is_test_cfg(line: &str) -> bool {
    let line = line.trim();
    line.starts_with("#[cfg(test)]") || line.starts_with("#[cfg(all(test,")
}

/// The item after the attribute ending at `from`: its end (past its `;` or its braced body) and,
/// if it is `mod name;`, the name.
fn item_end(text: &str, from: usize) -> (usize, Option<String>) {
    let rest = &text[from..];
    let semi = rest.find(';');
    let open = rest.find('{');
    match (semi, open) {
        (Some(s), o) if o.is_none_or(|o| s < o) => {
            let item = rest[..s].trim();
            let module = item
                .strip_prefix("pub(crate) mod ")
                .or_else(|| item.strip_prefix("pub mod "))
                .or_else(|| item.strip_prefix("mod "))
                .map(|m| m.trim().to_owned());
            (from + s + 1, module)
        }
        (_, Some(o)) => (matching_brace(text, from + o), None),
        _ => (text.len(), None),
    }
}

/// `text` with every test-only item blanked (line numbers kept).
fn without_tests(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    while let Some(found) = text[at..].find("#[cfg(") {
        let start = at + found;
        let line_end = text[start..].find('\n').map_or(text.len(), |e| start + e);
        if !is_test_cfg(&text[start..line_end]) {
            out.push_str(&text[at..line_end]);
            at = line_end;
            continue;
        }
        let (end, _) = item_end(text, line_end);
        out.push_str(&text[at..start]);
        out.extend(text[start..end].chars().filter(|c| *c == '\n'));
        at = end;
    }
    out.push_str(&text[at..]);
    out
}

/// The files of modules declared test-only (`#[cfg(test)] mod tests;`).
fn test_only_files(src: &Path, files: &[PathBuf]) -> BTreeSet<PathBuf> {
    let mut out = BTreeSet::new();
    for file in files {
        let text = code(&read(file));
        let dir = match file.file_name().and_then(|n| n.to_str()) {
            Some("mod.rs" | "lib.rs" | "main.rs") => file.parent().unwrap_or(src).to_owned(),
            _ => file.with_extension(""),
        };
        let mut at = 0;
        while let Some(found) = text[at..].find("#[cfg(") {
            let start = at + found;
            let line_end = text[start..].find('\n').map_or(text.len(), |e| start + e);
            at = line_end;
            if !is_test_cfg(&text[start..line_end]) {
                continue;
            }
            if let (_, Some(module)) = item_end(&text, line_end) {
                out.insert(dir.join(format!("{module}.rs")));
                out.insert(dir.join(module).join("mod.rs"));
            }
        }
    }
    out
}

/// Every top-level name `text` reaches through `crate::` or an escaping `super::`, with its
/// line: `(line, name)`.
fn reached(text: &str, module: &[String]) -> Vec<(usize, String)> {
    let line_of = |at: usize| text[..at].matches('\n').count() + 1;
    let mut out = Vec::new();
    for (at, _) in text.match_indices("crate::") {
        if at > 0 && text[..at].ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_') {
            continue; // `some_crate::`, not ours
        }
        let rest = &text[at + "crate::".len()..];
        if rest.starts_with('{') {
            let open = at + "crate::".len();
            for head in group_heads(braced(text, open)) {
                out.push((line_of(at), head));
            }
        } else {
            out.push((line_of(at), identifier(rest).to_owned()));
        }
    }
    for (at, _) in text.match_indices("super::") {
        if at > 0 && text[..at].ends_with("super::") {
            continue; // counted from the first `super::` of the chain
        }
        let mut rest = &text[at..];
        let mut up = 0;
        while let Some(r) = rest.strip_prefix("super::") {
            up += 1;
            rest = r;
        }
        // A file's own module is `module`; `super` from a file `a/b.rs` is `a`.
        if up != module.len() {
            continue; // stays inside its top-level module
        }
        if rest.starts_with('{') {
            let open = text.len() - rest.len();
            for head in group_heads(braced(text, open)) {
                out.push((line_of(at), head));
            }
        } else {
            out.push((line_of(at), identifier(rest).to_owned()));
        }
    }
    out
}

/// The crate root's re-exports: a root name → the module it comes from (`Error` → `error`).
fn root_names(lib: &str) -> BTreeMap<String, String> {
    let mut names = BTreeMap::new();
    let lib = code(lib);
    let mut rest = lib.as_str();
    while let Some(at) = rest.find("pub use ") {
        rest = &rest[at + "pub use ".len()..];
        let end = rest.find(';').unwrap_or(rest.len());
        let statement = &rest[..end];
        rest = &rest[end..];
        let module = identifier(statement).to_owned();
        let items = statement[module.len()..].trim_start_matches("::");
        let items: Vec<&str> = match items.strip_prefix('{') {
            Some(group) => group.trim_end_matches('}').split(',').collect(),
            None => vec![items],
        };
        for item in items {
            let name = item.trim().rsplit(" as ").next().unwrap_or_default();
            let name = name.rsplit("::").next().unwrap_or_default().trim();
            if !name.is_empty() {
                names.insert(name.to_owned(), module.clone());
            }
        }
    }
    names
}

/// Every loop in the module graph `edges` ((from, to) → where `from` names `to`), one message
/// each, naming the imports that make it.
fn cycles(edges: &BTreeMap<(String, String), String>) -> Vec<String> {
    let mut graph: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (from, to) in edges.keys() {
        graph.entry(from).or_default().push(to);
        graph.entry(to).or_default();
    }
    let mut seen_loops = BTreeSet::new();
    let mut out = Vec::new();
    for &start in graph.keys() {
        // The shortest way back to `start`, breadth first.
        let mut previous: BTreeMap<&str, &str> = BTreeMap::new();
        let mut queue = std::collections::VecDeque::from([start]);
        let mut back = None;
        while let Some(at) = queue.pop_front() {
            for &next in &graph[at] {
                if next == start {
                    back = Some(at);
                    break;
                }
                if !previous.contains_key(next) {
                    previous.insert(next, at);
                    queue.push_back(next);
                }
            }
            if back.is_some() {
                break;
            }
        }
        let Some(mut at) = back else {
            continue;
        };
        let mut path = vec![start];
        while at != start {
            path.push(at);
            at = previous[at];
        }
        path.push(start);
        let last = path.len() - 1;
        path[1..last].reverse();
        let mut members: Vec<&str> = path[..path.len() - 1].to_vec();
        members.sort();
        if !seen_loops.insert(members) {
            continue;
        }
        let steps: Vec<String> = path
            .windows(2)
            .map(|w| {
                let at = &edges[&(w[0].to_owned(), w[1].to_owned())];
                format!("`{}` imports `{}` ({at})", w[0], w[1])
            })
            .collect();
        out.push(format!(
            "import cycle {}: {}",
            path.join(" -> "),
            steps.join("; ")
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_parser_reads_every_form_of_path() {
        let text = "use crate::{a, b::c, d::{e, f}};\nfn x() { crate::g::h(); }\n#[serde(with = \"crate::i::j\")]\nuse super::super::k;\nuse super::l;";
        let module = vec!["m".to_owned(), "n".to_owned()];
        let names: Vec<String> = reached(text, &module).into_iter().map(|(_, n)| n).collect();
        assert_eq!(names, ["a", "b", "d", "g", "i", "k"]);
        assert_eq!(
            root_names("pub use error::{Error, Result};\npub use server::run;\npub use store::{\n    A, B,\n};")
                .into_iter()
                .collect::<Vec<_>>(),
            [
                ("A".to_owned(), "store".to_owned()),
                ("B".to_owned(), "store".to_owned()),
                ("Error".to_owned(), "error".to_owned()),
                ("Result".to_owned(), "error".to_owned()),
                ("run".to_owned(), "server".to_owned())
            ]
        );
    }

    #[test]
    fn test_code_is_left_out() {
        let text = "use crate::a;\n#[cfg(test)]\nmod tests {\n    use crate::b;\n    fn f() { crate::c(); }\n}\n#[cfg(all(test, feature = \"x\"))]\nuse crate::d;\n#[cfg(not(test))]\nuse crate::e;\n";
        let kept = without_tests(text);
        assert_eq!(kept.lines().count(), text.lines().count());
        let names: Vec<String> = reached(&kept, &["m".to_owned()])
            .into_iter()
            .map(|(_, n)| n)
            .collect();
        assert_eq!(names, ["a", "e"]);
    }

    #[test]
    fn modules_kept_apart_may_not_import_one_another() {
        let dir = tempfile::tempdir().unwrap();
        let files = [
            ("lib.rs", "mod base;\nmod one;\nmod two;\n"),
            ("base.rs", ""),
            ("one.rs", "use crate::base;\nuse crate::two::X;\n"),
            ("two.rs", "use crate::base;\n"),
        ];
        for (name, text) in files {
            std::fs::write(dir.path().join(name), text).unwrap();
        }
        let table: &Table = &[
            ("base", &["base"]),
            ("fronts", &["one", "two"]),
            ("root", &["lib"]),
        ];
        assert!(problems(dir.path(), "src", table).is_empty());
        let apart = problems_apart(dir.path(), "src", table, &["fronts"]);
        assert_eq!(
            apart,
            ["src/one.rs:2: `one` imports `two`: the modules of fronts never import one another"]
        );
    }

    #[test]
    fn loops_are_named_once_with_their_imports() {
        let mut edges = BTreeMap::new();
        for (from, to) in [
            ("a", "b"),
            ("b", "a"),
            ("c", "d"),
            ("d", "e"),
            ("e", "c"),
            ("a", "c"),
        ] {
            edges.insert((from.to_owned(), to.to_owned()), format!("{from}.rs:1"));
        }
        let found = cycles(&edges);
        assert_eq!(found.len(), 2, "{found:#?}");
        assert!(found[0].starts_with("import cycle a -> b -> a: `a` imports `b` (a.rs:1)"));
        assert!(found[1].starts_with("import cycle c -> d -> e -> c"));
    }
}
