//! The dashboard (`/ui`): one page, its script and its style, embedded in the binary from
//! `proxy/ui/` — nothing is fetched from anywhere else, and the Content-Security-Policy says so
//! to the browser (no inline script or style, no other origin). The page holds no data: it reads
//! the `/v1` API with the caller's own bearer token, so it shows what that token may read.

use axum::extract::Path;
use axum::http::{header, HeaderName, HeaderValue};
use axum::response::{IntoResponse, Response};

use crate::Error;

/// What the page may load and connect to: this origin only.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
                   img-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

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

/// `GET /ui`: the page.
pub(super) async fn page() -> Response {
    asset("text/html; charset=utf-8", PAGE)
}

/// `GET /ui/{file}`: its script or style.
pub(super) async fn file(Path(name): Path<String>) -> Response {
    match FILES.iter().find(|(file, _, _)| *file == name) {
        Some((_, media_type, body)) => asset(media_type, body),
        None => Error::NoRoute.into_response(),
    }
}

fn asset(media_type: &'static str, body: &'static str) -> Response {
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
