//! The dashboard (`/ui`): one page, its script and its style, embedded in the binary from
//! `proxy/ui/` — nothing is fetched from anywhere else, and the Content-Security-Policy says so
//! to the browser (no inline script or style, no other origin). The page holds no data: it reads
//! the `/v1` API with the caller's own bearer token, so it shows what that token may read; with
//! `--ui-gateway`, `/ui/enforcer` relays fence-gateway's feed cut down to the same.

use std::sync::Arc;

use axum::extract::{Path, RawQuery, State};
use axum::http::{header, HeaderName, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};

use super::preamble::{Authorized, Reading};
use super::AppState;
use crate::auth::Op;
use crate::upstream::Upstream;
use crate::{Error, Result};

/// What the page may load and connect to: this origin only.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
                   img-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

/// The page's files: name under `/ui/`, media type, contents.
const FILES: [(&str, &str, &str); 3] = [
    (
        "favicon.svg",
        "image/svg+xml",
        include_str!("../../ui/favicon.svg"),
    ),
    (
        "app.js",
        "text/javascript; charset=utf-8",
        include_str!("../../ui/app.js"),
    ),
    (
        "app.css",
        "text/css; charset=utf-8",
        include_str!("../../ui/app.css"),
    ),
];

const PAGE: &str = include_str!("../../ui/index.html");

/// What the dashboard needs of this proxy's configuration.
pub(crate) struct Ui {
    /// The fence-gateway whose feed it shows (`--ui-gateway`).
    gateway: Option<Upstream>,
}

impl Ui {
    /// For a proxy whose dashboard shows `gateway`'s feed, if any.
    pub(crate) fn new(gateway: Option<Upstream>) -> Self {
        Self { gateway }
    }
}

/// `GET /ui`: the page.
pub(super) async fn page() -> Response {
    asset("text/html; charset=utf-8", PAGE.to_owned())
}

/// `GET /ui/{file}`: its script, its style, or its configuration.
pub(super) async fn file(State(app): State<Arc<AppState>>, Path(name): Path<String>) -> Response {
    if name == "config.json" {
        let config = serde_json::json!({ "enforcer": app.ui.gateway.is_some() });
        return asset("application/json", config.to_string());
    }
    match FILES.iter().find(|(file, _, _)| *file == name) {
        Some((_, media_type, body)) => asset(media_type, (*body).to_owned()),
        None => Error::NoRoute.into_response(),
    }
}

fn asset(media_type: &'static str, body: String) -> Response {
    let headers = [
        (header::CONTENT_TYPE, media_type),
        (header::CONTENT_SECURITY_POLICY, CSP),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::CACHE_CONTROL, "no-cache"),
        (
            HeaderName::from_static("cross-origin-resource-policy"),
            "same-origin",
        ),
    ]
    .map(|(name, value)| (name, HeaderValue::from_static(value)));
    (headers, body).into_response()
}

/// fence-gateway's feed as it is read and relayed: what is not here is not passed on.
#[derive(Debug, Deserialize, Serialize)]
struct Feed {
    /// Which gateway process: its refusals' numbers start again with another.
    process: String,
    marks: Vec<FeedMark>,
    refusals: Vec<FeedRefusal>,
    last: u64,
}

#[derive(Debug, Deserialize, Serialize)]
struct FeedMark {
    resource: String,
    mark: String,
    age_ms: u64,
}

#[derive(Debug, Deserialize, Serialize)]
struct FeedRefusal {
    seq: u64,
    age_ms: u64,
    resource: String,
    reason: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    token: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    mark: Option<String>,
}

/// Which of the feed's resources a caller may see: a `/v1` resource under one of its read
/// prefixes; a `/v3` lock's fencing domain (`lock/` + hex of `{principal}/{name}`) only its own
/// principal's — its hex starts with no read prefix a tenant could choose (`read:lo`
/// once showed every tenant's lock domains). With authentication off, everything.
struct Visible<'a> {
    readable: Vec<&'a str>,
    /// The caller's lock domains' common start; `None`: authentication is off.
    locks: Option<String>,
}

impl<'a> Visible<'a> {
    fn to(caller: Option<&'a crate::auth::Principal>) -> Self {
        match caller {
            Some(principal) => Self {
                readable: principal.prefixes(Op::Read).collect(),
                locks: Some(fencing::lock_resource(
                    format!("{}/", principal.name).as_bytes(),
                )),
            },
            None => Self {
                readable: vec![""],
                locks: None,
            },
        }
    }

    fn shows(&self, resource: &str) -> bool {
        if resource.starts_with(fencing::LOCK_RESOURCE_PREFIX) {
            return self
                .locks
                .as_deref()
                .is_none_or(|own| resource.starts_with(own));
        }
        self.readable.iter().any(|p| resource.starts_with(p))
    }
}

impl Feed {
    /// Whether every number is one the page can hold exactly and every token reads
    /// `era:revision` (a gateway that put anything else there is not relayed).
    fn is_sound(&self) -> bool {
        const EXACT: u64 = (1 << 53) - 1; // JavaScript's largest exact integer
        let token = |t: &str| {
            t.split_once(':').is_some_and(|(era, revision)| {
                [era, revision].iter().all(|n| {
                    !n.is_empty() && n.len() <= 20 && n.bytes().all(|b| b.is_ascii_digit())
                })
            })
        };
        self.last <= EXACT
            && self.process.len() <= 32
            && self.marks.iter().all(|m| token(&m.mark))
            && self.refusals.iter().all(|r| {
                r.seq <= EXACT
                    && r.token.as_deref().is_none_or(token)
                    && r.mark.as_deref().is_none_or(token)
            })
    }
}

/// `GET /ui/enforcer?after=N`: fence-gateway's feed (marks, recent refusals), only the
/// resources the caller may read — the gateway's feed names every tenant's.
pub(super) async fn enforcer(
    State(app): State<Arc<AppState>>,
    by: Authorized<Reading>,
    RawQuery(query): RawQuery,
) -> Result<Response> {
    let gateway = app.ui.gateway.as_ref().ok_or(Error::NoRoute)?;
    let after = fencing::layer::feed_after(query.as_deref()).ok_or_else(|| {
        Error::InvalidRequest("the only parameter is `after`, a sequence number".into())
    })?;
    let body = gateway.feed(after).await?;
    let mut feed: Feed = serde_json::from_slice(&body)
        .map_err(|e| Error::UpstreamUnavailable(format!("the enforcer's feed: {e}")))?;
    if !feed.is_sound() {
        return Err(Error::UpstreamUnavailable(
            "the enforcer's feed is not one this proxy can read".into(),
        ));
    }
    let visible = Visible::to(by.caller.as_deref());
    feed.marks.retain(|m| visible.shows(&m.resource));
    feed.refusals.retain(|r| visible.shows(&r.resource));
    let mut response = Json(feed).into_response();
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_feed_is_relayed_as_read_and_nothing_else() {
        let wire = r#"{"process":"p1","marks":[{"resource":"a","mark":"0:5","age_ms":3,"secret":"x"}],
            "refusals":[{"seq":2,"age_ms":1,"resource":"a","reason":"stale","token":"0:3","mark":"0:5"},
                        {"seq":1,"age_ms":9,"resource":"b","reason":"forged"}],"last":2,"extra":true}"#;
        let feed: Feed = serde_json::from_str(wire).unwrap();
        let again = serde_json::to_string(&feed).unwrap();
        assert!(
            !again.contains("secret") && !again.contains("extra"),
            "{again}"
        );
        assert!(again.contains(r#""token":"0:3""#) && !again.contains(r#""token":null"#));
        assert!(feed.is_sound());
        let odd = wire.replace(r#""token":"0:3""#, r#""token":"v1.k1.0.3.x""#);
        assert!(!serde_json::from_str::<Feed>(&odd).unwrap().is_sound());
        let big = wire.replace(r#""last":2"#, r#""last":18446744073709551615"#);
        assert!(!serde_json::from_str::<Feed>(&big).unwrap().is_sound());
    }

    #[test]
    fn a_lock_domain_is_shown_to_its_own_principal_only() {
        let mine = fencing::lock_resource(b"alice/payroll-db");
        let theirs = fencing::lock_resource(b"bob/payroll-db");
        let alice = Visible {
            readable: vec!["lo", "a-"],
            locks: Some(fencing::lock_resource(b"alice/")),
        };
        assert!(alice.shows(&mine) && alice.shows("a-1") && alice.shows("logs-1"));
        assert!(!alice.shows(&theirs) && !alice.shows("b-1"));
        let everyone = Visible::to(None);
        assert!(everyone.shows(&theirs) && everyone.shows("b-1"));
    }
}
