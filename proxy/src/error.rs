//! The crate's one error type. Every failure a request can meet is a variant here; the mapping
//! to an HTTP status and a problem+json body lives in one place, `api::problem`.

use serde::Serialize;

/// Everything that can go wrong while serving a request.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The request is malformed: bad JSON, wrong types, unknown fields, missing body.
    #[error("{0}")]
    InvalidRequest(String),
    /// A request field (or path segment, or header) has a value outside what is allowed.
    #[error("{field}: {reason}")]
    InvalidField {
        /// The field, path segment or header concerned.
        field: &'static str,
        /// Why it is refused.
        reason: String,
    },
    /// The body exceeds the configured limit.
    #[error("request body exceeds {limit} bytes")]
    BodyTooLarge {
        /// The limit in bytes.
        limit: usize,
    },
    /// The body did not arrive in full within the deadline (`--header-read-timeout`).
    #[error("the request body did not arrive within {0:?}")]
    BodyTimeout(std::time::Duration),
    /// The body is not JSON.
    #[error("content type must be application/json")]
    UnsupportedMediaType,
    /// The request needs the `Lease-Secret` header and has none.
    #[error("the Lease-Secret header is required")]
    MissingSecret,
    /// The secret does not belong to the current grant of the resource.
    #[error("the Lease-Secret does not match the current holder of this resource")]
    NotHolder,
    /// Client authentication is on (`--auth-tokens`) and the request names no known principal.
    #[error("authentication required: {0}")]
    Unauthenticated(&'static str),
    /// The principal may not do this operation on this resource (the token file's permissions).
    #[error("principal `{principal}` may not {op} {target}")]
    Forbidden {
        /// Who asked.
        principal: String,
        /// The operation.
        op: Op,
        /// The resource, or what else was asked for.
        target: String,
    },
    /// The grant was acquired by another principal: only that principal may renew, release,
    /// forward or replay it, whatever secret or key is shown.
    #[error("this grant belongs to another principal")]
    OtherPrincipal,
    /// The principal is over one of its quotas (`--quota-held`, `--quota-acquire-rate`).
    #[error("over the {quota} quota of this principal; retry in {retry_after} s")]
    QuotaExceeded {
        /// Which quota.
        quota: QuotaKind,
        /// Whole seconds until trying again makes sense (`Retry-After`).
        retry_after: u64,
    },
    /// Another holder has the resource.
    #[error("resource is held by another holder")]
    Held(Box<Conflict>),
    /// An acquire retried with an `Idempotency-Key` whose grant has already ended (released or
    /// expired) within the replay window: answered as used, never granted anew.
    #[error("this Idempotency-Key's grant has already ended; use a new key")]
    IdempotencyKeyUsed,
    /// The caller's lease has expired or been released.
    #[error("the lease has expired or was released")]
    Lost,
    /// Nothing holds the resource.
    #[error("no lease is held on this resource")]
    NotFound,
    /// No such route.
    #[error("no such route")]
    NoRoute,
    /// The route exists, not for this method.
    #[error("method not allowed")]
    MethodNotAllowed,
    /// etcd refused or failed the call.
    #[error("etcd: {0}")]
    Etcd(#[source] etcd_client::Error),
    /// etcd failed a batch of transactions this request's was one of (group commit); its
    /// outcome is unknown, as after any failed write.
    #[error("etcd: {0}")]
    EtcdBatch(String),
    /// The session named by the request has ended (closed or expired), or never existed.
    #[error("{SESSION_LOST}")]
    SessionLost,
    /// The request does not prove the session it names: a secret that is not the session's, or
    /// another principal's session (whatever the secret). Answered exactly as [`Error::SessionLost`],
    /// so that nobody tells a session they cannot prove from one that does not exist.
    #[error("{SESSION_LOST}")]
    SessionNotProven {
        /// For the audit log.
        why: ProofFailure,
    },
    /// No such session (it has ended, or never existed), on an inspection.
    #[error("no such session: it has ended or never existed")]
    NoSession,
    /// The events after a `Last-Event-ID` are no longer (compacted) or not yet in etcd's
    /// history: re-list and watch from now.
    #[error("the events after this Last-Event-ID are not available: {0}")]
    EventsUnavailable(String),
    /// This replica serves as many event streams as it may.
    #[error("this replica serves its maximum of {0} event streams")]
    TooManyWatches(usize),
    /// etcd did not answer in time.
    #[error("etcd did not answer within {0:?}")]
    EtcdTimeout(std::time::Duration),
    /// Forwarding is not configured (no `--upstream`).
    #[error("forwarding is not configured on this proxy")]
    ForwardingDisabled,
    /// The upstream could not be reached.
    #[error("upstream unreachable: {0}")]
    UpstreamUnavailable(String),
    /// The upstream did not answer in time.
    #[error("upstream did not answer within {0:?}")]
    UpstreamTimeout(std::time::Duration),
    /// The enforcer could not be pre-fenced, so the grant was withdrawn.
    #[error("pre-fencing the enforcer failed, the grant was withdrawn: {0}")]
    PrefenceFailed(String),
    /// No such fleet.
    #[error("no such fleet")]
    NoFleet,
    /// The fleet has no member of this name (it left, its session ended, or it never joined).
    #[error("no such member of this fleet")]
    NoMember,
    /// A join named a live member of another principal.
    #[error("this member name is taken by another principal's live member")]
    MemberTaken,
    /// The `Lease-Secret` does not prove the member's session (another member's, a grant's,
    /// forged, or another principal's).
    #[error("the Lease-Secret does not prove this member's session")]
    NotMember,
    /// The fleet has as many members as it may.
    #[error("this fleet has its maximum of {0} members")]
    FleetFull(usize),
    /// The fleet was made by another principal: only it may change or end it.
    #[error("this fleet belongs to another principal")]
    OtherPrincipalsFleet,
    /// The fleet changed under the request again and again (others writing it at the same
    /// time): nothing was changed; try again.
    #[error("the fleet changed while the request was served; nothing was changed, try again")]
    FleetChanged,
    /// The proxy is draining.
    #[error("the proxy is shutting down")]
    ShuttingDown,
    /// etcd holds a value under the proxy's prefix that the proxy did not write.
    #[error("corrupt record under key {key}: {reason}")]
    CorruptRecord {
        /// The etcd key.
        key: String,
        /// What is wrong with it.
        reason: String,
    },
}

/// What a request learns of a session it cannot use: whether it has ended, never existed, or
/// is not the caller's to prove, it is the same answer.
const SESSION_LOST: &str =
    "the session has ended or does not exist, or the Lease-Secret does not prove it";

/// What a permission allows (the token file's operations).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Acquire a resource, and renew or release one's own grants of it.
    Acquire,
    /// See who holds a resource (`GET` and the list).
    Read,
    /// Forward writes as the holder of one's own grant.
    Forward,
    /// The etcd-compatible `/v3` API.
    V3,
}

impl Op {
    /// The name used in the token file, in metrics labels and in audit lines.
    pub fn as_str(self) -> &'static str {
        match self {
            Op::Acquire => "acquire",
            Op::Read => "read",
            Op::Forward => "forward",
            Op::V3 => "v3",
        }
    }
}

impl std::fmt::Display for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which of a principal's quotas refused it (`--quota-held`, `--quota-acquire-rate`,
/// `--quota-watch-streams`, `--quota-fleets`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuotaKind {
    /// The grants it holds at once.
    Held,
    /// Its acquires per second.
    Rate,
    /// The event streams it has open on this replica.
    WatchStreams,
    /// The fleets it has made.
    Fleets,
}

impl QuotaKind {
    /// Every quota, in the order the docs list them.
    pub const ALL: [QuotaKind; 4] = [
        QuotaKind::Held,
        QuotaKind::Rate,
        QuotaKind::WatchStreams,
        QuotaKind::Fleets,
    ];

    /// The name in problem bodies (`quota`), metrics labels and audit lines.
    pub fn as_str(self) -> &'static str {
        match self {
            QuotaKind::Held => "held",
            QuotaKind::Rate => "rate",
            QuotaKind::WatchStreams => "watch-streams",
            QuotaKind::Fleets => "fleets",
        }
    }
}

impl std::fmt::Display for QuotaKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a request did not prove the session it named.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProofFailure {
    /// The session is another principal's (whatever the secret).
    OtherPrincipal,
    /// The secret is not the session's.
    WrongSecret,
}

impl ProofFailure {
    /// The outcome in audit lines.
    pub fn as_str(self) -> &'static str {
        match self {
            ProofFailure::OtherPrincipal => "other-principal",
            ProofFailure::WrongSecret => "wrong-secret",
        }
    }
}

impl From<etcd_client::Error> for Error {
    fn from(e: etcd_client::Error) -> Self {
        Self::Etcd(e)
    }
}

/// The current holder of a resource someone else asked for. Carries no secret and no signed
/// token: knowing who holds a resource must not let anyone act as the holder.
#[derive(Debug, Clone, Serialize)]
pub struct Conflict {
    /// The resource.
    pub resource: String,
    /// Who holds it.
    pub holder: String,
    /// The holder's token (revision, decimal string).
    pub token: String,
    /// Remaining TTL of the holder's lease as etcd reports it.
    pub expires_in_ms: u64,
}

impl Conflict {
    /// Seconds until the resource may be free, for `Retry-After` (at least 1).
    pub fn retry_after_secs(&self) -> u64 {
        self.expires_in_ms.div_ceil(1000).max(1)
    }
}

/// Result alias for this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::Conflict;

    #[test]
    fn retry_after_rounds_up_to_whole_seconds_and_is_never_zero() {
        let conflict = |expires_in_ms| Conflict {
            resource: "r".into(),
            holder: "h".into(),
            token: "1".into(),
            expires_in_ms,
        };
        for (ms, secs) in [(0, 1), (1, 1), (1000, 1), (1001, 2), (29_500, 30)] {
            assert_eq!(conflict(ms).retry_after_secs(), secs, "{ms} ms");
        }
    }
}
