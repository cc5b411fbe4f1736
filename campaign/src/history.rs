//! The history: every client operation with its invocation, completion and outcome.

use std::sync::Mutex;

use tokio::time::Instant;

/// What was attempted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Acquire a resource.
    Acquire,
    /// Write to the resource through the proxy's forward route.
    WriteViaProxy,
    /// Write to the resource directly through the enforcer with the signed token.
    WriteDirect,
    /// Renew the lease.
    Renew,
    /// Release the lease.
    Release,
    /// Exchange a lock key (etcd's Mutex recipe, over gRPC) for its fencing token at
    /// `/v3/lock/token`: a grant, announced to nobody but its holder (no pre-fence).
    Lock,
    /// A fleet's grant, as its member saw it appear in its assignment (`held`, with its token):
    /// made by the service on the member's session and pre-fenced, but shown by the member's
    /// view as soon as it exists in etcd — possibly before its pre-fence has completed.
    Assigned,
}

impl Kind {
    /// Whether this is a write.
    pub fn is_write(self) -> bool {
        matches!(self, Kind::WriteViaProxy | Kind::WriteDirect)
    }

    /// Whether this hands out a token: an acquire, a lock's exchange or a fleet's grant.
    pub fn is_grant(self) -> bool {
        matches!(self, Kind::Acquire | Kind::Lock | Kind::Assigned)
    }
}

/// How it ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Succeeded (2xx).
    Ok,
    /// Definitely did not take effect (4xx), with the status.
    Fail(u16),
    /// Unknown: timeout, connection error, or a 5xx after which the effect is uncertain.
    Indeterminate,
}

/// One operation.
#[derive(Debug, Clone)]
pub struct Event {
    /// The client.
    pub client: String,
    /// What it did.
    pub kind: Kind,
    /// On which resource.
    pub resource: String,
    /// The token revision involved (granted, or held when writing), if any.
    pub revision: Option<u64>,
    /// The client's operation id (for writes: the id the storage logs).
    pub op: u64,
    /// When the client sent it.
    pub invoked: Instant,
    /// When the client saw the outcome.
    pub completed: Instant,
    /// The outcome.
    pub outcome: Outcome,
}

/// The shared history.
#[derive(Default)]
pub struct History {
    events: Mutex<Vec<Event>>,
}

impl History {
    /// Appends an event.
    pub fn record(&self, event: Event) {
        if let Ok(mut e) = self.events.lock() {
            e.push(event);
        }
    }

    /// A copy of every event so far.
    pub fn events(&self) -> Vec<Event> {
        self.events.lock().map(|e| e.clone()).unwrap_or_default()
    }

    /// Whether an acquire (or a lock's exchange) of `resource` has returned a token above
    /// `revision`.
    pub fn granted_above(&self, resource: &str, revision: u64) -> bool {
        self.events.lock().is_ok_and(|events| {
            events.iter().any(|e| {
                e.kind.is_grant()
                    && e.outcome == Outcome::Ok
                    && e.resource == resource
                    && e.revision.is_some_and(|r| r > revision)
            })
        })
    }
}

/// An HTTP answer's status and JSON body (`None` where there was no answer, or no JSON).
pub async fn answer(
    sent: reqwest::Result<reqwest::Response>,
) -> (Option<u16>, Option<serde_json::Value>) {
    match sent {
        Ok(r) => {
            let status = r.status().as_u16();
            (Some(status), r.json::<serde_json::Value>().await.ok())
        }
        Err(_) => (None, None),
    }
}

/// Classifies an HTTP answer (or its absence).
pub fn outcome(status: Option<u16>) -> Outcome {
    match status {
        Some(s) if (200..300).contains(&s) => Outcome::Ok,
        Some(s) if (400..500).contains(&s) => Outcome::Fail(s),
        _ => Outcome::Indeterminate,
    }
}
