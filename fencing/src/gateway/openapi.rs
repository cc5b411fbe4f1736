//! fence-gateway's OpenAPI 3.1 document, served at `GET /openapi.json`: the gateway's own
//! routes, registered from their `#[utoipa::path]` annotations (so the document lists exactly
//! what they serve), and every problem type the gateway answers. Everything else is the
//! storage's, forwarded: its own document describes it, this one does not.

use std::collections::BTreeSet;
use std::sync::OnceLock;

use axum::response::{IntoResponse, Response};
use http::{header, HeaderValue, StatusCode};
use serde::Serialize;
use serde_json::json;
use utoipa::openapi::security::SecurityScheme;
use utoipa::openapi::OpenApi;
use utoipa::ToSchema;

use crate::layer::{problem, Rejection};
use crate::{Token, TokenError};
use runtime::openapi::{ProblemType, Problems};

/// A pre-fence's answer: the resource's mark, now at least the presented token.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct Fenced {
    /// The resource.
    pub(super) resource: String,
    /// Its high-water mark.
    pub(super) mark: Mark,
}

/// A high-water mark (a token: the proxy's era and the grant's revision, decimal strings).
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct Mark {
    /// The era.
    #[schema(pattern = "^[0-9]+$")]
    pub(super) era: String,
    /// The revision.
    #[schema(pattern = "^[0-9]+$")]
    pub(super) revision: String,
}

impl From<Token> for Mark {
    fn from(t: Token) -> Self {
        Self {
            era: t.era.to_string(),
            revision: t.revision.to_string(),
        }
    }
}

/// `GET /fence-gateway/feed`'s answer: [`crate::layer::Feed`] on the wire.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct FeedDoc {
    /// Which gateway process: sequence numbers start again with another (ask from 0).
    #[schema(max_length = 32)]
    process: String,
    /// Marks, most recently raised first.
    marks: Vec<FeedMarkDoc>,
    /// Refusals after `after`, newest first.
    refusals: Vec<FeedRefusalDoc>,
    /// The sequence number of the newest refusal (0: none yet).
    last: u64,
}

/// A mark in the feed.
#[derive(Debug, Serialize, ToSchema)]
struct FeedMarkDoc {
    /// The resource.
    resource: String,
    /// The highest token admitted for it, `era:revision`.
    #[schema(pattern = "^[0-9]+:[0-9]+$")]
    mark: String,
    /// How long ago it was first admitted, in milliseconds.
    age_ms: u64,
}

/// A refusal in the feed.
#[derive(Debug, Serialize, ToSchema)]
struct FeedRefusalDoc {
    /// Its sequence number.
    seq: u64,
    /// How long ago, in milliseconds (a duration: compare it with no clock).
    age_ms: u64,
    /// The resource the write was for.
    resource: String,
    /// Why: below the mark, not signed by a key of the keyring, for another resource, or not a
    /// token.
    #[schema(pattern = "^(stale|forged|misdirected|malformed)$")]
    reason: &'static str,
    /// The refused token (`era:revision`), when verified (stale).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^[0-9]+:[0-9]+$")]
    token: Option<String>,
    /// The mark it was below (stale).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^[0-9]+:[0-9]+$")]
    mark: Option<String>,
}

impl From<crate::layer::Feed> for FeedDoc {
    fn from(feed: crate::layer::Feed) -> Self {
        Self {
            process: feed.process,
            marks: feed
                .marks
                .into_iter()
                .map(|m| FeedMarkDoc {
                    resource: m.resource,
                    mark: m.mark.to_string(),
                    age_ms: m.age_ms,
                })
                .collect(),
            refusals: feed
                .refusals
                .into_iter()
                .map(|r| FeedRefusalDoc {
                    seq: r.seq,
                    age_ms: r.age_ms,
                    resource: r.resource,
                    reason: r.reason.as_str(),
                    token: r.token.map(|t| t.to_string()),
                    mark: r.mark.map(|t| t.to_string()),
                })
                .collect(),
            last: feed.last,
        }
    }
}

#[derive(utoipa::OpenApi)]
#[openapi(
    info(
        title = "fence-gateway",
        description = "A reverse proxy in front of a storage service that enforces fencing tokens on every write.\n\n\
            This document describes the gateway's own routes only. Every other request is forwarded to the storage: \
            reads pass through; a write needs a `Fencing-Token` (and, without `--resource-path`, a `Fencing-Resource` header) \
            and is refused with a problem (`application/problem+json`, with a `Fencing-Rejection` header naming its type) \
            when the token is missing, invalid, for another resource or below the resource's high-water mark. \
            The gateway's own paths shadow the storage's paths of the same name.",
    ),
    tags(
        (name = "fencing", description = "Raising a resource's mark without a write"),
        (name = "operations", description = "Liveness, readiness, metrics and this document"),
    ),
    modifiers(&ClientCertificate),
)]
struct Base;

/// The optional client certificate of `--fence-principals`.
struct ClientCertificate;

impl utoipa::Modify for ClientCertificate {
    fn modify(&self, doc: &mut OpenApi) {
        doc.components
            .get_or_insert_with(Default::default)
            .add_security_scheme(
            "client_certificate",
            SecurityScheme::MutualTls {
                description: Some(
                    "With `--fence-principals`: a verified client certificate naming one of them"
                        .to_owned(),
                ),
                extensions: None,
            },
        );
    }
}

/// The document's frame (info, tags, security schemes) for the router to add its paths to.
pub(super) fn base() -> OpenApi {
    <Base as utoipa::OpenApi>::openapi()
}

/// One example of every refusal of the enforcer (each maps to one problem type).
fn rejections() -> Vec<Rejection> {
    let token = Token::new(0, 1);
    vec![
        Rejection::MissingToken,
        Rejection::DuplicateToken,
        Rejection::MissingResource,
        Rejection::BadResource,
        Rejection::DuplicateResource,
        Rejection::ResourceMismatch,
        Rejection::AmbiguousPath,
        Rejection::UnmatchedPath,
        Rejection::ReadWithBody,
        Rejection::Token(TokenError::Malformed),
        Rejection::Token(TokenError::WrongResource),
        Rejection::Stale { token, mark: token },
        Rejection::StoreUnavailable,
        Rejection::AdmittedTooLate,
    ]
}

/// The gateway's answers that are not the enforcer's: (status, slug).
const GATEWAY_PROBLEMS: [(StatusCode, &str); 8] = [
    (StatusCode::BAD_REQUEST, "invalid-target"),
    (StatusCode::BAD_REQUEST, "invalid-request"),
    (StatusCode::PAYLOAD_TOO_LARGE, "body-too-large"),
    (StatusCode::BAD_GATEWAY, "upstream-unavailable"),
    (StatusCode::GATEWAY_TIMEOUT, "upstream-timeout"),
    (StatusCode::FORBIDDEN, "client-certificate-required"),
    (StatusCode::FORBIDDEN, "forbidden"),
    (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
];

/// Every problem type the gateway answers, once each.
fn problem_types() -> Vec<ProblemType> {
    let mut seen = BTreeSet::new();
    rejections()
        .iter()
        .map(Rejection::classify)
        .chain(GATEWAY_PROBLEMS)
        .filter(|(_, slug)| seen.insert(*slug))
        .map(|(status, slug)| ProblemType {
            status,
            slug,
            title: status.canonical_reason().unwrap_or("Error"),
        })
        .collect()
}

/// The complete document.
pub(super) fn finish(doc: &OpenApi) -> serde_json::Result<serde_json::Value> {
    let types = problem_types();
    runtime::openapi::finish(
        doc,
        &Problems {
            types: &types,
            extensions: vec![(
                "mark",
                json!({"$ref": "#/components/schemas/Mark",
                    "description": "`stale-fencing-token`: the resource's mark"}),
            )],
            common: &[(StatusCode::SERVICE_UNAVAILABLE, "The mark store failed")],
            common_under: "/fence/",
            headers: &[(
                StatusCode::SERVICE_UNAVAILABLE,
                "Retry-After",
                "Seconds to wait",
            )],
        },
    )
}

/// This document, as served.
#[utoipa::path(
    get,
    path = "/openapi.json",
    operation_id = "openapi",
    tag = "operations",
    responses((status = 200, description = "This document (OpenAPI 3.1)", body = Object)),
)]
pub(super) async fn serve() -> Response {
    static JSON: OnceLock<Option<String>> = OnceLock::new();
    let json = JSON.get_or_init(|| {
        super::document()
            .and_then(|doc| serde_json::to_string(&doc))
            .ok()
    });
    match json {
        Some(json) => (
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            json.clone(),
        )
            .into_response(),
        None => problem(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "the OpenAPI document could not be rendered",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Adding a refusal to [`Rejection`] breaks this match until it gets an index here, and
    /// then the test until [`rejections`] lists it.
    fn index(r: &Rejection) -> usize {
        match r {
            Rejection::MissingToken => 0,
            Rejection::DuplicateToken => 1,
            Rejection::MissingResource => 2,
            Rejection::BadResource => 3,
            Rejection::DuplicateResource => 4,
            Rejection::ResourceMismatch => 5,
            Rejection::AmbiguousPath => 6,
            Rejection::UnmatchedPath => 7,
            Rejection::ReadWithBody => 8,
            Rejection::Token(TokenError::WrongResource) => 9,
            Rejection::Token(_) => 10,
            Rejection::Stale { .. } => 11,
            Rejection::StoreUnavailable => 12,
            Rejection::AdmittedTooLate => 13,
        }
    }

    #[test]
    fn every_refusal_is_a_documented_problem_type() {
        let listed: BTreeSet<usize> = rejections().iter().map(index).collect();
        assert_eq!(listed, (0..=13).collect());
        let types = problem_types();
        for r in rejections() {
            let (status, slug) = r.classify();
            assert!(
                types.iter().any(|t| t.slug == slug && t.status == status),
                "{slug}"
            );
        }
        let slugs: BTreeSet<&str> = types.iter().map(|t| t.slug).collect();
        assert_eq!(slugs.len(), types.len(), "one entry per problem type");
    }
}
