//! Checks of a served OpenAPI 3.1 document: its structure (what the OpenAPI 3.1 specification
//! requires of the objects the binaries use), every schema valid JSON Schema 2020-12 whose
//! `$ref`s resolve, links that name real operations and parameters, and the list of its
//! operations for the route-drift tests.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{json, Value};

/// The HTTP methods an OpenAPI path item can describe, in its own spelling.
pub const METHODS: [&str; 8] = [
    "get", "put", "post", "delete", "options", "head", "patch", "trace",
];

/// Every operation of `doc`: path template → the methods it documents (upper case).
pub fn operations(doc: &Value) -> BTreeMap<String, BTreeSet<String>> {
    let mut out = BTreeMap::new();
    if let Some(paths) = doc["paths"].as_object() {
        for (path, item) in paths {
            let methods = METHODS
                .iter()
                .filter(|m| item.get(**m).is_some())
                .map(|m| m.to_ascii_uppercase())
                .collect();
            out.insert(path.clone(), methods);
        }
    }
    out
}

/// What is wrong with `doc` as an OpenAPI 3.1 document; empty when nothing is.
pub fn problems(doc: &Value) -> Vec<String> {
    let mut found = Vec::new();
    let mut bad = |what: String| found.push(what);
    match doc["openapi"].as_str() {
        Some(v) if v.starts_with("3.1.") => {}
        other => bad(format!("`openapi` is {other:?}, not 3.1.x")),
    }
    if !doc["info"]["title"].is_string() || !doc["info"]["version"].is_string() {
        bad("`info` needs a string `title` and `version`".into());
    }
    let Some(paths) = doc["paths"].as_object() else {
        bad("no `paths` object".into());
        return found;
    };
    let mut operation_ids = BTreeMap::new();
    let mut operations_by_id = BTreeMap::new();
    for (path, item) in paths {
        if !path.starts_with('/') {
            bad(format!("path `{path}` does not start with `/`"));
        }
        let templated: BTreeSet<String> = path
            .split('{')
            .skip(1)
            .filter_map(|s| s.split_once('}').map(|(name, _)| name.to_owned()))
            .collect();
        for method in METHODS {
            let Some(op) = item.get(method) else { continue };
            let at = format!("{} {path}", method.to_ascii_uppercase());
            if let Some(id) = op["operationId"].as_str() {
                if let Some(other) = operation_ids.insert(id.to_owned(), at.clone()) {
                    bad(format!("operationId `{id}` used by {other} and {at}"));
                }
                operations_by_id.insert(id.to_owned(), op.clone());
            }
            let params = op["parameters"].as_array().cloned().unwrap_or_default();
            let mut seen = BTreeSet::new();
            let mut in_path = BTreeSet::new();
            for p in &params {
                let (Some(name), Some(location)) = (p["name"].as_str(), p["in"].as_str()) else {
                    bad(format!("{at}: a parameter without `name` and `in`"));
                    continue;
                };
                if !["path", "query", "header", "cookie"].contains(&location) {
                    bad(format!("{at}: parameter `{name}` in `{location}`"));
                }
                if !seen.insert((location.to_owned(), name.to_ascii_lowercase())) {
                    bad(format!("{at}: parameter `{name}` twice in {location}"));
                }
                if location == "path" {
                    in_path.insert(name.to_owned());
                    if p["required"] != json!(true) {
                        bad(format!("{at}: path parameter `{name}` is not required"));
                    }
                }
                if p.get("schema").is_none() && p.get("content").is_none() {
                    bad(format!(
                        "{at}: parameter `{name}` has neither schema nor content"
                    ));
                }
            }
            if in_path != templated {
                bad(format!(
                    "{at}: path parameters {in_path:?} do not match the template's {templated:?}"
                ));
            }
            match op["responses"].as_object() {
                Some(responses) if !responses.is_empty() => {
                    for (code, response) in responses {
                        let valid_code = code == "default"
                            || (code.len() == 3
                                && code.starts_with(['1', '2', '3', '4', '5'])
                                && (code[1..].chars().all(|c| c.is_ascii_digit())
                                    || &code[1..] == "XX"));
                        if !valid_code {
                            bad(format!("{at}: response key `{code}`"));
                        }
                        if !response["description"].is_string() {
                            bad(format!("{at} {code}: no description"));
                        }
                    }
                }
                _ => bad(format!("{at}: no responses")),
            }
        }
    }
    check_links(paths, &operations_by_id, &mut bad);
    let components = doc["components"].clone();
    let mut schemas = Vec::new();
    collect_schemas(doc, "#", &mut schemas);
    for (at, schema) in schemas {
        if let Err(e) = jsonschema::draft202012::meta::validate(&schema) {
            bad(format!("{at}: not a JSON Schema 2020-12: {e}"));
            continue;
        }
        // The schema with the document's components beside it, so `#/components/...` resolves.
        let rooted = json!({"components": components, "allOf": [schema]});
        if let Err(e) = jsonschema::draft202012::new(&rooted) {
            bad(format!(
                "{at}: does not compile (bad `$ref` or pattern?): {e}"
            ));
        }
    }
    found
}

/// Every link must name an existing operation and only parameters it has.
fn check_links(
    paths: &serde_json::Map<String, Value>,
    operations: &BTreeMap<String, Value>,
    bad: &mut impl FnMut(String),
) {
    for (path, item) in paths {
        for method in METHODS {
            let Some(responses) = item.get(method).and_then(|op| op["responses"].as_object())
            else {
                continue;
            };
            for (code, response) in responses {
                let Some(links) = response["links"].as_object() else {
                    continue;
                };
                for (name, link) in links {
                    let at = format!("{method} {path} {code} link `{name}`");
                    let Some(target) = link["operationId"]
                        .as_str()
                        .and_then(|id| operations.get(id))
                    else {
                        bad(format!("{at}: no such operationId"));
                        continue;
                    };
                    let params = target["parameters"].as_array().cloned().unwrap_or_default();
                    for key in link["parameters"]
                        .as_object()
                        .map(|p| p.keys().cloned().collect::<Vec<_>>())
                        .unwrap_or_default()
                    {
                        let (location, name) = match key.split_once('.') {
                            Some((l, n)) => (Some(l.to_owned()), n.to_owned()),
                            None => (None, key.clone()),
                        };
                        let exists = params.iter().any(|p| {
                            p["name"].as_str().map(str::to_ascii_lowercase)
                                == Some(name.to_ascii_lowercase())
                                && location
                                    .as_deref()
                                    .is_none_or(|l| p["in"].as_str() == Some(l))
                        });
                        if !exists {
                            bad(format!("{at}: the target has no parameter `{key}`"));
                        }
                    }
                }
            }
        }
    }
}

/// Every Schema Object of the document, with where it is.
fn collect_schemas(value: &Value, at: &str, out: &mut Vec<(String, Value)>) {
    match value {
        Value::Object(map) => {
            for (key, child) in map {
                let here = format!("{at}/{key}");
                if key == "schema" && child.is_object() {
                    out.push((here, child.clone()));
                } else if key == "schemas" && at.ends_with("/components") {
                    if let Some(schemas) = child.as_object() {
                        for (name, schema) in schemas {
                            out.push((format!("{here}/{name}"), schema.clone()));
                        }
                    }
                } else {
                    collect_schemas(child, &here, out);
                }
            }
        }
        Value::Array(items) => {
            for (i, child) in items.iter().enumerate() {
                collect_schemas(child, &format!("{at}/{i}"), out);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sound_document_passes_and_broken_ones_are_named() {
        let good = json!({
            "openapi": "3.1.0",
            "info": {"title": "t", "version": "1"},
            "paths": {"/a/{id}": {"get": {
                "operationId": "a",
                "parameters": [{"name": "id", "in": "path", "required": true, "schema": {"type": "string"}}],
                "responses": {"200": {"description": "ok", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/A"}}}}}
            }}},
            "components": {"schemas": {"A": {"type": "object"}}}
        });
        assert_eq!(problems(&good), Vec::<String>::new());
        assert_eq!(
            operations(&good),
            BTreeMap::from([("/a/{id}".to_owned(), BTreeSet::from(["GET".to_owned()]))])
        );

        let mut v30 = good.clone();
        v30["openapi"] = json!("3.0.3");
        assert_eq!(problems(&v30).len(), 1);
        let mut dangling = good.clone();
        dangling["components"]["schemas"] = json!({});
        assert!(problems(&dangling)[0].contains("does not compile"));
        let mut untemplated = good.clone();
        untemplated["paths"]["/a/{id}"]["get"]["parameters"] = json!([]);
        assert!(problems(&untemplated)[0].contains("do not match"));
        let mut bad_schema = good;
        bad_schema["components"]["schemas"]["A"] = json!({"type": 3});
        assert!(problems(&bad_schema)
            .iter()
            .any(|p| p.contains("components/schemas/A: not a JSON Schema")));
    }
}
