//! Header names and values the fronts share: one spelling for every layer that reads or strips
//! them (the `/v1` handlers, the forwarder, the `/v3` front's refusals).

/// The header carrying the proof of holding (a grant's or a session's secret).
pub(crate) const SECRET_HEADER: &str = "lease-secret";

/// The header making an acquire idempotent.
pub(crate) const IDEMPOTENCY_HEADER: &str = "idempotency-key";

/// The challenge of a 401 for a missing, malformed or unknown bearer token.
pub(crate) const BEARER_CHALLENGE: &str = "Bearer realm=\"lease-proxy\"";
