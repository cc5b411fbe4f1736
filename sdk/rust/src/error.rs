//! The crate's one error type, and how a proxy's answer becomes one.

use serde::Deserialize;

/// Every problem type URI of the proxy starts with this.
pub(crate) const PROBLEM_BASE: &str = "https://lease-proxy.dev/problems/";

/// What can go wrong talking to lease-proxy.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The resource is held by someone else (409 `lease-held`).
    #[error("held by {holder} (token {token}) for up to {expires_in_ms} ms more")]
    Held {
        /// Who holds it.
        holder: String,
        /// The holder's token (its grant's create revision).
        token: u64,
        /// How long the holder's lease may still last, as etcd reported it.
        expires_in_ms: u64,
    },
    /// The lease is gone: it expired, was released or replaced (410 `lease-lost`), or this
    /// guard already reported it lost.
    #[error("the lease is lost")]
    Lost,
    /// The session ended: closed, lapsed or never existed (410 `session-lost`).
    #[error("the session is lost")]
    SessionLost,
    /// Any other problem the proxy answered (`application/problem+json`, RFC 9457).
    #[error("{status} {title}: {detail} ({kind})")]
    Problem {
        /// HTTP status.
        status: u16,
        /// The problem `type` URI.
        kind: String,
        /// Its short title.
        title: String,
        /// What happened, for a human.
        detail: String,
    },
    /// A watch's resume point is no longer in etcd's history (410 `events-compacted`): list
    /// again and watch without a last event id.
    #[error("the watch resume point was compacted away: list again and watch from now")]
    Compacted,
    /// The request took longer than the client's timeout.
    #[error("request timed out")]
    Timeout,
    /// The request could not be delivered or its answer read.
    #[error("HTTP: {0}")]
    Http(reqwest::Error),
    /// The client was set up wrongly (bad URL, unreadable certificate…).
    #[error("configuration: {0}")]
    Config(String),
    /// The proxy answered something that is not its API: a body that does not parse (not
    /// JSON, a field missing or of the wrong type), a `lease-held` problem whose fields do not
    /// parse, a malformed watch event, or an answer body (or event-stream line) over 1 MiB.
    #[error("protocol: {0}")]
    Protocol(String),
}

/// The crate's result type.
pub type Result<T> = std::result::Result<T, Error>;

impl From<reqwest::Error> for Error {
    fn from(e: reqwest::Error) -> Self {
        if e.is_timeout() {
            Error::Timeout
        } else {
            Error::Http(e)
        }
    }
}

impl Error {
    /// Whether retrying the same request may succeed: the request may not have arrived or the
    /// proxy (or etcd behind it) was briefly unavailable.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Timeout | Error::Http(_) => true,
            Error::Problem { status, .. } => matches!(status, 502..=504),
            _ => false,
        }
    }

    /// Whether a watch reconnects after this error: a transient one, any 5xx answer, or a 429
    /// (the principal's share of the replica's event streams is taken: it frees when one of
    /// its streams ends).
    pub(crate) fn reconnects_watch(&self) -> bool {
        self.is_transient()
            || matches!(
                self,
                Error::Problem {
                    status: 429 | 500..=599,
                    ..
                }
            )
    }

    /// The problem slug (the last segment of the `type` URI) of a [`Error::Problem`].
    pub fn slug(&self) -> Option<&str> {
        match self {
            Error::Problem { kind, .. } => Some(kind.strip_prefix(PROBLEM_BASE).unwrap_or(kind)),
            _ => None,
        }
    }
}

/// The members of a problem body the client reads.
#[derive(Debug, Default, Deserialize)]
struct ProblemBody {
    #[serde(rename = "type", default)]
    kind: String,
    #[serde(default)]
    title: String,
    #[serde(default)]
    detail: String,
    #[serde(default)]
    holder: Option<String>,
    #[serde(default)]
    token: Option<String>,
    #[serde(default)]
    expires_in_ms: Option<u64>,
}

/// The error for a non-success answer with status `status` and body `body`.
pub(crate) fn from_answer(status: u16, body: &[u8]) -> Error {
    let problem: ProblemBody = serde_json::from_slice(body).unwrap_or_default();
    let slug = problem.kind.strip_prefix(PROBLEM_BASE).unwrap_or("");
    match (status, slug) {
        (409, "lease-held") => {
            if let (Some(holder), Some(token)) = (problem.holder.clone(), &problem.token) {
                if let Ok(token) = token.parse() {
                    return Error::Held {
                        holder,
                        token,
                        expires_in_ms: problem.expires_in_ms.unwrap_or(0),
                    };
                }
            }
            return Error::Protocol(format!(
                "409 lease-held without a holder and a decimal token: {}",
                String::from_utf8_lossy(body)
                    .chars()
                    .take(500)
                    .collect::<String>()
            ));
        }
        (410, "lease-lost") => return Error::Lost,
        (410, "session-lost") => return Error::SessionLost,
        (410, s) if s.ends_with("events-compacted") => return Error::Compacted,
        _ => {}
    }
    let detail = if problem.detail.is_empty() && problem.kind.is_empty() {
        String::from_utf8_lossy(body).chars().take(500).collect()
    } else {
        problem.detail
    };
    Error::Problem {
        status,
        kind: problem.kind,
        title: problem.title,
        detail,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn problems_become_their_variants() {
        let held = br#"{"type":"https://lease-proxy.dev/problems/lease-held","title":"Lease held","status":409,"detail":"x","resource":"a","holder":"bob","token":"42","expires_in_ms":900}"#;
        match from_answer(409, held) {
            Error::Held {
                holder,
                token,
                expires_in_ms,
            } => assert_eq!((holder.as_str(), token, expires_in_ms), ("bob", 42, 900)),
            other => panic!("{other:?}"),
        }
        let lost = br#"{"type":"https://lease-proxy.dev/problems/lease-lost","title":"Lease lost","status":410,"detail":"x"}"#;
        assert!(matches!(from_answer(410, lost), Error::Lost));
        let session = br#"{"type":"https://lease-proxy.dev/problems/session-lost","title":"t","status":410,"detail":"x"}"#;
        assert!(matches!(from_answer(410, session), Error::SessionLost));
        let compacted = br#"{"type":"https://lease-proxy.dev/problems/events-compacted","title":"t","status":410,"detail":"x"}"#;
        assert!(matches!(from_answer(410, compacted), Error::Compacted));
        let e = from_answer(
            503,
            br#"{"type":"https://lease-proxy.dev/problems/etcd-unavailable","title":"etcd unavailable","status":503,"detail":"d"}"#,
        );
        assert!(e.is_transient());
        assert_eq!(e.slug(), Some("etcd-unavailable"));
        match from_answer(502, b"bad gateway") {
            Error::Problem { status, detail, .. } => {
                assert_eq!((status, detail.as_str()), (502, "bad gateway"))
            }
            other => panic!("{other:?}"),
        }
        assert!(!from_answer(400, b"{}").is_transient());
    }
}
