//! Imports in `proxy/src` flow one way (house rule 1a): a module may name its own layer and the
//! layers below it, never one above — and a front never names another front: each is a thin
//! shell over the domain, so one can change (or go) without the others. The layers, lowest
//! first:
//!
//! | layer | modules | holds |
//! |---|---|---|
//! | leaves | `error`, `headers`, `keys`, `metrics`, `audit`, `negative_control` | names and writers every layer shares: the error type, header names, the etcd key layout, the metrics, the audit log, and the campaign's deliberately broken behaviours (compiled only with the `negative-controls` feature) |
//! | calls | `etcd`, `upstream`, `forward`, `prefence` | calls to etcd (bounded calls, batches, keepalive and watch streams), to the upstream (forwarding's client, and the holder's write forwarded with its token) and the pre-fence (at the enforcer, in PostgreSQL) |
//! | domain | `lease`, `fleet`, `etcdapi` | leases, sessions, the event feed and the local view: what a grant is and how it changes; fleets: who should hold what, and the grants that follow; the etcd-compatible core every etcd front calls |
//! | callers | `auth` | who calls: bearer tokens and client certificates to principals, and their permissions |
//! | fronts | `api`, `v3`, `grpc` | the `/v1` HTTP API (its forward route included), etcd's JSON gateway and etcd's gRPC API over the etcd-compatible core |
//! | wiring | `config`, `server`, `lib`, `main`, `bin` | the configuration, and assembling, serving and stopping the parts |
//!
//! `forward` serves no route of its own: it is the call that carries a holder's write to the
//! upstream, which the `/v1` forward route makes — so it sits with the calls, not the fronts.
//! What the fronts share sits below them: the judgement of who calls in `auth`
//! (`auth::Judge`), the core in `etcdapi`; `server` wires each front to them.
//!
//! Every `.rs` file under `proxy/src` is read for the paths it names: `use crate::x…`, grouped
//! `use crate::{x, y::z}`, inline `crate::x::…` (in attributes' strings too, such as
//! `#[serde(with = "crate::…")]`), and `super::…` that climbs out of its top-level module; a name
//! re-exported at the crate root (`crate::Error`) counts as the module it comes from (lib.rs's
//! `pub use`). Comment lines are skipped.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The layer whose modules may not import one another (see the table above).
const FRONTS: &str = "fronts";

/// The layers, lowest first (see the table above).
const LAYERS: &[(&str, &[&str])] = &[
    (
        "leaves",
        &[
            "error",
            "headers",
            "keys",
            "metrics",
            "audit",
            "negative_control",
        ],
    ),
    ("calls", &["etcd", "upstream", "forward", "prefence"]),
    ("domain", &["lease", "fleet", "etcdapi"]),
    ("callers", &["auth"]),
    ("fronts", &["api", "v3", "grpc"]),
    ("wiring", &["config", "server", "lib", "main", "bin"]),
];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn layer_of(module: &str) -> Option<(usize, &'static str)> {
    LAYERS
        .iter()
        .enumerate()
        .find(|(_, (_, modules))| modules.contains(&module))
        .map(|(i, (name, _))| (i, *name))
}

fn rs_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rs_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The module path of a file under `src` (`lease/mod.rs` → `[lease]`, `lease/view.rs` →
/// `[lease, view]`, `lib.rs` → `[]`).
fn module_path(relative: &Path) -> Vec<String> {
    let mut parts: Vec<String> = relative
        .iter()
        .map(|p| p.to_str().unwrap().trim_end_matches(".rs").to_owned())
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

/// The text between the `{` at `open` and its matching `}`.
fn braced(text: &str, open: usize) -> &str {
    let mut depth = 0;
    for (i, c) in text[open..].char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return &text[open + 1..open + i];
                }
            }
            _ => {}
        }
    }
    &text[open + 1..]
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

/// Every top-level name `text` reaches through `crate::` or an escaping `super::`, with its
/// line: `(line, name)`.
fn reached(text: &str, module: &[String]) -> Vec<(usize, String)> {
    let line_of = |at: usize| text[..at].matches('\n').count() + 1;
    let mut out = Vec::new();
    for (at, _) in text.match_indices("crate::") {
        if at > 0 && text[..at].ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_') {
            continue; // `lease_proxy_crate::`, not ours
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
        if up < module.len() {
            continue; // stays inside its top-level module
        }
        if up == module.len() {
            if rest.starts_with('{') {
                let open = text.len() - rest.len();
                for head in group_heads(braced(text, open)) {
                    out.push((line_of(at), head));
                }
            } else {
                out.push((line_of(at), identifier(rest).to_owned()));
            }
        }
    }
    out
}

/// lib.rs's re-exports: a root name → the module it comes from (`Error` → `error`).
fn root_names(lib: &str) -> BTreeMap<String, String> {
    let mut names = BTreeMap::new();
    for line in lib.lines() {
        let Some(rest) = line.trim().strip_prefix("pub use ") else {
            continue;
        };
        let module = identifier(rest).to_owned();
        let items = rest[module.len()..].trim_start_matches("::");
        let items: Vec<&str> = match items.strip_prefix('{') {
            Some(group) => group.trim_end_matches("};").split(',').collect(),
            None => vec![items.trim_end_matches(';')],
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

/// Every import from a lower layer into a higher one, or from a front into another front, as a
/// message a line.
fn upward_imports() -> Vec<String> {
    let src = src();
    let roots = root_names(&std::fs::read_to_string(src.join("lib.rs")).unwrap());
    let mut files = Vec::new();
    rs_files(&src, &mut files);
    files.sort();
    let mut problems = Vec::new();
    for file in files {
        let relative = file.strip_prefix(&src).unwrap();
        let module = module_path(relative);
        let own = module.first().cloned().unwrap_or_else(|| {
            relative
                .to_str()
                .unwrap()
                .trim_end_matches(".rs")
                .to_owned()
        });
        let shown = format!("proxy/src/{}", relative.display());
        let Some((own_layer, own_name)) = layer_of(&own) else {
            problems.push(format!(
                "{shown}: module `{own}` is in no layer of tests/layers.rs"
            ));
            continue;
        };
        let text = code(&std::fs::read_to_string(&file).unwrap());
        for (line, name) in reached(&text, &module) {
            let target = roots.get(&name).cloned().unwrap_or(name);
            if target == own {
                continue;
            }
            let Some((layer, layer_name)) = layer_of(&target) else {
                continue; // not a module (a macro, `crate::` in a string of prose)
            };
            if layer > own_layer {
                problems.push(format!(
                    "{shown}:{line}: `{own}` ({own_name}) imports `{target}` ({layer_name}): a lower layer may not import a higher one"
                ));
            } else if layer == own_layer && own_name == FRONTS {
                problems.push(format!(
                    "{shown}:{line}: `{own}` imports `{target}`: a front never imports another front"
                ));
            }
        }
    }
    problems
}

#[test]
fn imports_flow_from_the_fronts_down() {
    let problems = upward_imports();
    assert!(problems.is_empty(), "\n{}\n", problems.join("\n"));
}

#[test]
fn every_top_level_module_has_a_layer() {
    let mut files = Vec::new();
    rs_files(&src(), &mut files);
    for file in files {
        let relative = file.strip_prefix(src()).unwrap();
        let top = relative
            .iter()
            .next()
            .unwrap()
            .to_str()
            .unwrap()
            .trim_end_matches(".rs");
        assert!(layer_of(top).is_some(), "{top} is in no layer");
    }
}

#[test]
fn the_parser_reads_every_form_of_path() {
    let text = "use crate::{a, b::c, d::{e, f}};\nfn x() { crate::g::h(); }\n#[serde(with = \"crate::i::j\")]\nuse super::super::k;\nuse super::l;";
    let module = vec!["m".to_owned(), "n".to_owned()];
    let names: Vec<String> = reached(text, &module).into_iter().map(|(_, n)| n).collect();
    assert_eq!(names, ["a", "b", "d", "g", "i", "k"]);
    assert_eq!(
        root_names("pub use error::{Error, Result};\npub use server::run;")
            .into_iter()
            .collect::<Vec<_>>(),
        [
            ("Error".to_owned(), "error".to_owned()),
            ("Result".to_owned(), "error".to_owned()),
            ("run".to_owned(), "server".to_owned())
        ]
    );
}
