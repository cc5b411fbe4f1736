//! API discovery the way etcd's gateway clients do it: `GET /version` (etcd3gw, for one, reads
//! `etcdserver` and picks `/v3/` for 3.4 and later, `/v3beta/` for 3.3 — both served here) and
//! `GET /health`. Both are answered with what an etcd member answers, relayed from the pinned
//! member under the etcd deadline, failing over to the next member; nothing of the client's
//! request (query, headers, body) is sent on.

use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use tokio::time::{Duration, Instant};

use super::status::plain;
use super::V3;
use crate::etcdapi::{Code, Status};

/// Largest answer relayed (etcd's are a few dozen bytes).
const MAX_ANSWER: usize = 16 * 1024;

/// An etcd member's answer.
struct Answer {
    status: StatusCode,
    content_type: Option<HeaderValue>,
    body: Bytes,
}

impl Answer {
    fn response(self) -> Response {
        let mut response = (self.status, self.body).into_response();
        if let Some(ct) = self.content_type {
            response.headers_mut().insert(header::CONTENT_TYPE, ct);
        }
        response
    }
}

/// etcd's answer to a method other than GET on these paths.
fn method_not_allowed() -> Response {
    let mut response = plain(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed\n");
    response
        .headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static("GET"));
    response
}

impl V3 {
    /// `GET /version`: `{"etcdserver":…,"etcdcluster":…}` from a member.
    pub(crate) async fn version(&self, method: &Method) -> Response {
        if method != Method::GET {
            return method_not_allowed();
        }
        match self.relay("/version", |_| true).await {
            Ok(answer) => answer.response(),
            Err(None) => {
                Status::new(Code::Unavailable, "lease-proxy: no etcd member answered").response()
            }
            Err(Some(answer)) => answer.response(),
        }
    }

    /// `GET /health`: a healthy member's `{"health":"true"}`; if none is healthy within the
    /// deadline, the last unhealthy answer, or etcd's own `{"health":"false"}` (503).
    pub(crate) async fn health(&self, method: &Method) -> Response {
        if method != Method::GET {
            return method_not_allowed();
        }
        match self.relay("/health", |a| a.status == StatusCode::OK).await {
            Ok(answer) | Err(Some(answer)) => answer.response(),
            Err(None) => plain(StatusCode::SERVICE_UNAVAILABLE, "{\"health\":\"false\"}\n"),
        }
    }

    /// GETs `path` from the pinned member until an answer is `good`, moving to the next member
    /// after a failure, within the etcd deadline. `Err` holds the last answer, if any came.
    async fn relay(
        &self,
        path: &str,
        good: impl Fn(&Answer) -> bool,
    ) -> Result<Answer, Option<Answer>> {
        let timeout = self.etcd.timeout();
        let deadline = Instant::now() + timeout;
        let mut last = None;
        loop {
            let pinned = self.etcd.pinned();
            let url = format!(
                "{}{path}",
                self.etcd.endpoint(pinned.index).trim_end_matches('/')
            );
            let attempt = async {
                let req = http::Request::get(url).body(Full::new(Bytes::new())).ok()?;
                let resp = self.http.request(req).await.ok()?;
                let status = resp.status();
                let content_type = resp.headers().get(header::CONTENT_TYPE).cloned();
                let body = Limited::new(resp.into_body(), MAX_ANSWER)
                    .collect()
                    .await
                    .ok()?
                    .to_bytes();
                Some(Answer {
                    status,
                    content_type,
                    body,
                })
            };
            let attempt_deadline = (Instant::now() + timeout / 3).min(deadline);
            match tokio::time::timeout_at(attempt_deadline, attempt).await {
                Ok(Some(answer)) if good(&answer) => return Ok(answer),
                Ok(Some(answer)) => {
                    last = Some(answer);
                    self.etcd.unpin(pinned.index);
                }
                _ => self.etcd.unpin(pinned.index),
            }
            let pause = Duration::from_millis(20);
            if Instant::now() + pause >= deadline {
                return Err(last);
            }
            tokio::time::sleep(pause).await;
        }
    }
}
