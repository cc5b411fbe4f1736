//! RFC 9457 problem details as both binaries write them: one body shape (`type`, `title`,
//! `status`, `detail`, then any extension members), one media type, one base URI. lease-proxy's
//! errors and fence-gateway's refusals are each classified in one place of their own and written
//! here.

use http::{header, HeaderValue, Response, StatusCode};
use serde_json::{Map, Value};

/// Base of every problem `type` URI, lease-proxy's and fence-gateway's alike; each problem is
/// documented under this path in docs/API.md.
pub const PROBLEM_BASE: &str = "https://lease-proxy.dev/problems/";

/// The media type of a problem.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// The body of the problem `slug`: `type` (under [`PROBLEM_BASE`]), `title`, `status` and
/// `detail`, then the members of `extra` (if any), in that order.
pub fn body(
    status: StatusCode,
    slug: &str,
    title: &str,
    detail: &str,
    extra: Option<Map<String, Value>>,
) -> String {
    let mut problem = Map::new();
    problem.insert(
        "type".into(),
        Value::String(format!("{PROBLEM_BASE}{slug}")),
    );
    problem.insert("title".into(), Value::String(title.to_owned()));
    problem.insert("status".into(), Value::from(status.as_u16()));
    problem.insert("detail".into(), Value::String(detail.to_owned()));
    problem.extend(extra.unwrap_or_default());
    Value::Object(problem).to_string()
}

/// The response of the problem `slug` (see [`body`]), with its status and media type; callers
/// add their own headers (`Retry-After`, `WWW-Authenticate`, …).
pub fn response<B: From<String>>(
    status: StatusCode,
    slug: &str,
    title: &str,
    detail: &str,
    extra: Option<Map<String, Value>>,
) -> Response<B> {
    let mut response = Response::new(B::from(body(status, slug, title, detail, extra)));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn problems_keep_their_members_in_order() {
        let mut extra = Map::new();
        extra.insert("mark".into(), serde_json::json!({"era": "0"}));
        let resp: Response<String> = response(
            StatusCode::CONFLICT,
            "stale",
            "Conflict",
            "too old",
            Some(extra),
        );
        assert_eq!(resp.status(), StatusCode::CONFLICT);
        assert_eq!(resp.headers()[header::CONTENT_TYPE], PROBLEM_JSON);
        assert_eq!(
            resp.body(),
            r#"{"type":"https://lease-proxy.dev/problems/stale","title":"Conflict","status":409,"detail":"too old","mark":{"era":"0"}}"#
        );
    }
}
