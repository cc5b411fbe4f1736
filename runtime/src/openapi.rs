//! Completing an OpenAPI 3.1 document built by utoipa from handler annotations, for the
//! binaries that serve `/openapi.json` (fence-gateway and lease-proxy): every refusal described
//! as RFC 9457 problem details narrowed to the problem types of its status, the list of problem
//! types in the description, operation ids made unique per method, and what utoipa 5 writes
//! differently from the specification put right.

use http::StatusCode;
use serde_json::{json, Map, Value};
use utoipa::openapi::OpenApi;

/// The media type of every refusal.
pub use crate::problem::PROBLEM_JSON;

/// One problem type a binary answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProblemType {
    /// The status it comes with.
    pub status: StatusCode,
    /// The last segment of its `type` URI (under [`crate::problem::PROBLEM_BASE`]).
    pub slug: &'static str,
    /// Its `title`.
    pub title: &'static str,
}

/// What [`finish`] adds to a document.
#[derive(Debug, Clone)]
pub struct Problems<'a> {
    /// Every problem type the binary answers.
    pub types: &'a [ProblemType],
    /// Extension members some problems carry: name → JSON Schema.
    pub extensions: Vec<(&'static str, Value)>,
    /// Statuses every operation under `common_under` may answer besides its own, with their
    /// descriptions.
    pub common: &'a [(StatusCode, &'static str)],
    /// The path prefix of the operations `common` applies to.
    pub common_under: &'a str,
    /// Headers refusals carry: (status, name, description).
    pub headers: &'a [(StatusCode, &'static str, &'static str)],
}

/// The methods of a path item.
const METHODS: [&str; 8] = [
    "get", "put", "post", "delete", "options", "head", "patch", "trace",
];

/// `doc` as JSON, completed as [`Problems`] says. Operations with a `default` response (whose
/// answers are someone else's, like forwarded ones) are left as they are.
pub fn finish(doc: &OpenApi, problems: &Problems<'_>) -> serde_json::Result<Value> {
    let mut doc = serde_json::to_value(doc)?;
    let base = crate::problem::PROBLEM_BASE;
    let mut table = String::from("\n\n| status | problem `type` | title |\n| --- | --- | --- |\n");
    for t in problems.types {
        table.push_str(&format!(
            "| {} | `{base}{}` | {} |\n",
            t.status.as_u16(),
            t.slug,
            t.title
        ));
    }
    let description = doc["info"]["description"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    doc["info"]["description"] = Value::String(description + &table);
    doc["components"]["schemas"]["Problem"] = problem_schema(problems);
    if let Some(paths) = doc["paths"].as_object_mut() {
        for (path, item) in paths.iter_mut() {
            let Some(item) = item.as_object_mut() else {
                continue;
            };
            unique_operation_ids(item);
            for method in METHODS {
                if let Some(op) = item.get_mut(method).and_then(Value::as_object_mut) {
                    complete(path, op, problems);
                }
            }
        }
    }
    Ok(doc)
}

/// One handler serving several methods of a path gets one operation id per method.
fn unique_operation_ids(item: &mut Map<String, Value>) {
    let ids: Vec<String> = METHODS
        .iter()
        .filter_map(|m| {
            item.get(*m)?
                .get("operationId")?
                .as_str()
                .map(str::to_owned)
        })
        .collect();
    for method in METHODS {
        let Some(op) = item.get_mut(method) else {
            continue;
        };
        let Some(id) = op["operationId"].as_str().map(str::to_owned) else {
            continue;
        };
        if ids.iter().filter(|other| **other == id).count() > 1 {
            op["operationId"] = Value::String(format!("{id}_{method}"));
        }
    }
}

/// utoipa 5 writes a Link Object's fields in snake case (fixed in utoipa 6): camel case, as
/// OpenAPI has them.
fn camel_case_links(responses: &mut Map<String, Value>) {
    for link in responses
        .values_mut()
        .filter_map(|r| r.get_mut("links").and_then(Value::as_object_mut))
        .flat_map(|links| links.values_mut())
        .filter_map(Value::as_object_mut)
    {
        for (snake, camel) in [
            ("operation_id", "operationId"),
            ("operation_ref", "operationRef"),
            ("request_body", "requestBody"),
        ] {
            if let Some(value) = link.remove(snake) {
                link.insert(camel.to_owned(), value);
            }
        }
    }
}

fn complete(path: &str, op: &mut Map<String, Value>, problems: &Problems<'_>) {
    let Some(responses) = op.get_mut("responses").and_then(Value::as_object_mut) else {
        return;
    };
    camel_case_links(responses);
    if responses.contains_key("default") {
        return;
    }
    if path.starts_with(problems.common_under) {
        for (status, description) in problems.common {
            responses
                .entry(status.as_u16().to_string())
                .or_insert_with(|| json!({ "description": description }));
        }
    }
    for (code, response) in responses.iter_mut() {
        let Some(status) = code
            .parse::<u16>()
            .ok()
            .and_then(|c| StatusCode::from_u16(c).ok())
        else {
            continue;
        };
        if !(status.is_client_error() || status.is_server_error())
            || response.get("content").is_some()
        {
            continue;
        }
        let types: Vec<&ProblemType> = problems
            .types
            .iter()
            .filter(|t| t.status == status)
            .collect();
        let names: Vec<String> = types.iter().map(|t| format!("`{}`", t.slug)).collect();
        let description = response["description"].as_str().unwrap_or_default();
        response["description"] = Value::String(format!(
            "{description} (problem type: {})",
            names.join(", ")
        ));
        let uris: Vec<String> = types
            .iter()
            .map(|t| format!("{}{}", crate::problem::PROBLEM_BASE, t.slug))
            .collect();
        response["content"] = json!({ PROBLEM_JSON: { "schema": { "allOf": [
            { "$ref": "#/components/schemas/Problem" },
            { "properties": { "type": { "enum": uris } } },
        ] } } });
        for (_, name, description) in problems.headers.iter().filter(|h| h.0 == status) {
            response["headers"][*name] = json!({
                "description": description,
                "schema": { "type": "string" },
            });
        }
    }
}

/// RFC 9457 problem details: the binary's problem types and extension members.
fn problem_schema(problems: &Problems<'_>) -> Value {
    let uris: Vec<String> = problems
        .types
        .iter()
        .map(|t| format!("{}{}", crate::problem::PROBLEM_BASE, t.slug))
        .collect();
    let mut statuses: Vec<u16> = problems.types.iter().map(|t| t.status.as_u16()).collect();
    statuses.sort_unstable();
    statuses.dedup();
    let mut schema = json!({
        "type": "object",
        "description": "A refusal (RFC 9457 problem details)",
        "required": ["type", "title", "status", "detail"],
        "properties": {
            "type": { "type": "string", "enum": uris, "description": "The problem type" },
            "title": { "type": "string", "description": "Short, the same for every problem of the type" },
            "status": { "type": "integer", "enum": statuses },
            "detail": { "type": "string", "description": "What happened, for a human" },
        },
    });
    for (name, extension) in &problems.extensions {
        schema["properties"][*name] = extension.clone();
    }
    schema
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_are_problems_of_their_status_and_ids_unique() {
        let doc: OpenApi = serde_json::from_value(json!({
            "openapi": "3.1.0",
            "info": {"title": "t", "version": "1", "description": "D"},
            "paths": {
                "/a": {
                    "get": {"operationId": "a", "responses": {"404": {"description": "gone"}}},
                    "put": {"operationId": "a", "responses": {"default": {"description": "any"}}}
                },
                "/b": {"post": {"operationId": "b", "responses": {"200": {"description": "ok",
                    "links": {"l": {"operation_id": "a", "parameters": {"x": "$response.body#/x"}}}}}}}
            }
        }))
        .unwrap();
        let types = [
            ProblemType {
                status: StatusCode::NOT_FOUND,
                slug: "nope",
                title: "Nope",
            },
            ProblemType {
                status: StatusCode::SERVICE_UNAVAILABLE,
                slug: "down",
                title: "Down",
            },
        ];
        let out = finish(
            &doc,
            &Problems {
                types: &types,
                extensions: vec![("mark", json!({"type": "object"}))],
                common: &[(StatusCode::SERVICE_UNAVAILABLE, "down")],
                common_under: "/a",
                headers: &[(StatusCode::SERVICE_UNAVAILABLE, "Retry-After", "later")],
            },
        )
        .unwrap();
        let get = &out["paths"]["/a"]["get"];
        assert_eq!(get["operationId"], "a_get");
        assert_eq!(out["paths"]["/a"]["put"]["operationId"], "a_put");
        assert_eq!(
            get["responses"]["404"]["content"][PROBLEM_JSON]["schema"]["allOf"][1]["properties"]
                ["type"]["enum"],
            json!(["https://lease-proxy.dev/problems/nope"])
        );
        assert_eq!(
            get["responses"]["503"]["headers"]["Retry-After"]["description"],
            "later"
        );
        // The forwarded operation keeps its `default` alone.
        assert_eq!(
            out["paths"]["/a"]["put"]["responses"],
            json!({"default": {"description": "any"}})
        );
        assert!(out["paths"]["/b"]["post"]["responses"].get("503").is_none());
        assert_eq!(
            out["paths"]["/b"]["post"]["responses"]["200"]["links"]["l"],
            json!({"operationId": "a", "parameters": {"x": "$response.body#/x"}})
        );
        assert!(out["info"]["description"]
            .as_str()
            .unwrap()
            .contains("| 404 | `https://lease-proxy.dev/problems/nope` | Nope |"));
        assert_eq!(
            out["components"]["schemas"]["Problem"]["properties"]["status"]["enum"],
            json!([404, 503])
        );
    }
}
