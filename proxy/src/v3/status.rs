//! Every `/v3` failure as etcd's gateway renders it: the core's [`Status`] (a gRPC code and
//! message) turned into an HTTP status and `{"error":…,"message":…,"code":…}` in exactly one
//! place, [`Status::response`].

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;

use crate::etcdapi::{Code, Status};

/// The HTTP status etcd's gateway (grpc-gateway 1.9's `HTTPStatusFromCode`) gives `code`.
fn http_status(code: i32) -> StatusCode {
    match code {
        0 => StatusCode::OK,
        1 => StatusCode::REQUEST_TIMEOUT,
        3 | 9 | 11 => StatusCode::BAD_REQUEST,
        4 => StatusCode::GATEWAY_TIMEOUT,
        5 => StatusCode::NOT_FOUND,
        6 | 10 => StatusCode::CONFLICT,
        7 => StatusCode::FORBIDDEN,
        8 => StatusCode::TOO_MANY_REQUESTS,
        12 => StatusCode::NOT_IMPLEMENTED,
        14 => StatusCode::SERVICE_UNAVAILABLE,
        16 => StatusCode::UNAUTHORIZED,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// The gateway's answer for `status` with HTTP status `http`. Fields in the gateway's order;
/// like its JSON marshaller, an empty message is omitted.
fn rendered(status: &Status, http: StatusCode) -> Response {
    let mut body = serde_json::Map::new();
    if !status.message().is_empty() {
        body.insert("error".into(), status.message().into());
        body.insert("message".into(), status.message().into());
    }
    body.insert("code".into(), status.code().into());
    let mut response = json(http, serde_json::Value::Object(body).to_string());
    if status.code() == Code::Unauthenticated as i32 {
        response.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            header::HeaderValue::from_static(crate::headers::BEARER_CHALLENGE),
        );
    }
    response
}

impl Status {
    /// The gateway's answer for this status.
    pub(crate) fn response(&self) -> Response {
        rendered(self, http_status(self.code()))
    }
}

/// The answer to a body over the proxy's limit: ResourceExhausted, as HTTP 413.
pub(crate) fn too_large(limit: usize) -> Response {
    let status = Status::new(
        Code::ResourceExhausted,
        format!("lease-proxy: request body larger than {limit} bytes"),
    );
    rendered(&status, StatusCode::PAYLOAD_TOO_LARGE)
}

impl IntoResponse for Status {
    fn into_response(self) -> Response {
        self.response()
    }
}

/// A JSON answer.
pub(crate) fn json(status: StatusCode, body: impl Into<Bytes>) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.into(),
    )
        .into_response()
}

/// A plain-text answer, as Go's `http.Error` writes it.
pub(crate) fn plain(status: StatusCode, text: &'static str) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        text,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_map_like_the_gateway() {
        for (code, http) in [
            (Code::InvalidArgument, 400),
            (Code::NotFound, 404),
            (Code::Unknown, 500),
            (Code::Unavailable, 503),
            (Code::Unimplemented, 501),
            (Code::PermissionDenied, 403),
            (Code::Unauthenticated, 401),
        ] {
            assert_eq!(Status::new(code, "x").response().status().as_u16(), http);
        }
        assert_eq!(too_large(10).status().as_u16(), 413);
    }
}
