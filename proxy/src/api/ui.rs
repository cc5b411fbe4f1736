//! The dashboard (`/ui`): one page, its script and its style, embedded in the binary from
//! `proxy/ui/` — nothing is fetched from anywhere else, and the Content-Security-Policy says so
//! to the browser (no inline script or style; connections to this origin and, with
//! `--ui-gateway`, to that fence-gateway's). The page holds no data: it reads the `/v1` API with
//! the caller's own bearer token, so it shows what that token may read.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{header, HeaderName, HeaderValue};
use axum::response::{IntoResponse, Response};

use super::AppState;
use crate::Error;

/// The page's files: name under `/ui/`, media type, contents.
const FILES: [(&str, &str, &str); 2] = [
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

/// What the dashboard's answers carry for this proxy's configuration.
pub(crate) struct Ui {
    /// The Content-Security-Policy of every file.
    csp: HeaderValue,
    /// `/ui/config.json`: where the enforcer's feed is, if anywhere.
    config: String,
}

impl Ui {
    /// For a proxy whose dashboard shows the feed of the fence-gateway at `gateway`
    /// (`--ui-gateway`, validated at start to be `http(s)://host[:port][/path]` with a plain
    /// host; anything else is left out, and the page shows no feed).
    pub(crate) fn new(gateway: Option<&str>) -> Self {
        let gateway = gateway.map(|g| g.trim_end_matches('/')).and_then(|url| {
            let uri: axum::http::Uri = url.parse().ok()?;
            let origin = format!("{}://{}", uri.scheme_str()?, uri.authority()?);
            Some((url, origin))
        });
        let csp = |origin: &str| {
            HeaderValue::from_str(&format!(
                "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'{origin}; \
                 img-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
            ))
            .ok()
        };
        match gateway.and_then(|(url, origin)| Some((url, csp(&format!(" {origin}"))?))) {
            Some((url, csp)) => Self {
                csp,
                config: serde_json::json!({ "gateway": url }).to_string(),
            },
            None => Self {
                csp: csp("").unwrap_or(HeaderValue::from_static("default-src 'none'")),
                config: serde_json::json!({ "gateway": null }).to_string(),
            },
        }
    }
}

/// `GET /ui`: the page.
pub(super) async fn page(State(app): State<Arc<AppState>>) -> Response {
    asset(&app.ui, "text/html; charset=utf-8", PAGE.to_owned())
}

/// `GET /ui/{file}`: its script, its style, or its configuration.
pub(super) async fn file(State(app): State<Arc<AppState>>, Path(name): Path<String>) -> Response {
    if name == "config.json" {
        return asset(&app.ui, "application/json", app.ui.config.clone());
    }
    match FILES.iter().find(|(file, _, _)| *file == name) {
        Some((_, media_type, body)) => asset(&app.ui, media_type, (*body).to_owned()),
        None => Error::NoRoute.into_response(),
    }
}

fn asset(ui: &Ui, media_type: &'static str, body: String) -> Response {
    let fixed = [
        (header::CONTENT_TYPE, media_type),
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
    let mut response = (fixed, body).into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_SECURITY_POLICY, ui.csp.clone());
    response
}
