//! The test mode, FoundationDB's client-side buggify for leases, for an application's own
//! tests: a client built with [`crate::ClientBuilder::test_mode`] injects faults at set rates —
//! a guard lost when a renewal is due, a renewal sent late, a renewal attempt failed without
//! being sent, a lease's fencing token refused as stale — through its own renewal, loss and
//! fencing code, so that the application's on-lost and on-refused paths run. Never in
//! production.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::error::{self, Error};

/// A fault the test mode injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Fault {
    /// At a renewal due, the guard (lease or session) is lost as if the proxy had refused the
    /// renewal ([`crate::LostReason::Revoked`], [`crate::Lease::lost_injected`]), and its grant
    /// is released (its session closed) on the proxy.
    Loss,
    /// A renewal due is sent late, by up to the whole lifetime last granted: it may cross the
    /// stop-by deadline ([`crate::LostReason::Expired`]).
    LateRenewal,
    /// A renewal attempt fails as if the proxy were unreachable, without being sent; it is
    /// retried as any transient failure is, until the deadline.
    FailedRenewal,
    /// The lease's fencing token is refused as stale without anything being sent, as when a
    /// newer holder has written: [`crate::Lease::forward`] answers fence-gateway's 409 (with
    /// `Fencing-Rejection: stale-fencing-token`); [`crate::Lease::fence`],
    /// [`crate::Lease::fencing_headers`] and [`crate::Lease::forward_request`] return that
    /// problem as an [`Error::Problem`] (slug `stale-fencing-token`). The lease is not lost.
    TokenRefusal,
}

/// Told of every fault injected: its kind and the resource (a session's id for a session's
/// keepalive).
type OnFault = Arc<dyn Fn(Fault, &str) + Send + Sync>;

/// The rates (0 to 1) at which a client injects each [`Fault`]: the probability that one
/// chance fires — a renewal due ([`Fault::Loss`], [`Fault::LateRenewal`]), a renewal attempt
/// ([`Fault::FailedRenewal`]), a `fence`, `fencing_headers`, `forward` or `forward_request`
/// of a lease ([`Fault::TokenRefusal`]). The same seed gives the same draws in order.
#[derive(Clone, Default)]
pub struct TestMode {
    loss_rate: f64,
    late_renewal_rate: f64,
    failed_renewal_rate: f64,
    token_refusal_rate: f64,
    seed: Option<u64>,
    on_fault: Option<OnFault>,
}

impl fmt::Debug for TestMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TestMode")
            .field("loss_rate", &self.loss_rate)
            .field("late_renewal_rate", &self.late_renewal_rate)
            .field("failed_renewal_rate", &self.failed_renewal_rate)
            .field("token_refusal_rate", &self.token_refusal_rate)
            .field("seed", &self.seed)
            .field("on_fault", &self.on_fault.is_some())
            .finish()
    }
}

impl TestMode {
    /// No fault at all (every rate 0), seeded from the operating system.
    pub fn new() -> Self {
        Self::default()
    }

    /// The chance that a guard is lost at a renewal due ([`Fault::Loss`]).
    pub fn loss_rate(mut self, rate: f64) -> Self {
        self.loss_rate = rate;
        self
    }

    /// The chance that a renewal due is sent late ([`Fault::LateRenewal`]).
    pub fn late_renewal_rate(mut self, rate: f64) -> Self {
        self.late_renewal_rate = rate;
        self
    }

    /// The chance that a renewal attempt fails unsent ([`Fault::FailedRenewal`]).
    pub fn failed_renewal_rate(mut self, rate: f64) -> Self {
        self.failed_renewal_rate = rate;
        self
    }

    /// The chance that a lease's fencing token is refused ([`Fault::TokenRefusal`]).
    pub fn token_refusal_rate(mut self, rate: f64) -> Self {
        self.token_refusal_rate = rate;
        self
    }

    /// Repeats a run's draws: the same seed gives the same faults at the same chances.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Called for every fault injected, with its kind and the resource (a session's id for a
    /// session's keepalive), from the task that injects it.
    pub fn on_fault(mut self, on_fault: impl Fn(Fault, &str) + Send + Sync + 'static) -> Self {
        self.on_fault = Some(Arc::new(on_fault));
        self
    }

    fn rate(&self, fault: Fault) -> f64 {
        match fault {
            Fault::Loss => self.loss_rate,
            Fault::LateRenewal => self.late_renewal_rate,
            Fault::FailedRenewal => self.failed_renewal_rate,
            Fault::TokenRefusal => self.token_refusal_rate,
        }
    }
}

/// A client's dice: its test mode and the seeded generator every chance draws from.
#[derive(Debug)]
pub(crate) struct Faults {
    mode: TestMode,
    rng: Mutex<StdRng>,
}

impl Faults {
    pub(crate) fn new(mode: TestMode) -> Self {
        let seed = mode.seed.unwrap_or_else(|| rand::rng().random());
        Self {
            mode,
            rng: Mutex::new(StdRng::seed_from_u64(seed)),
        }
    }

    fn draw(&self) -> f64 {
        self.rng
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .random::<f64>()
    }

    /// Whether the chance of `fault` fires now for `resource` (told to `on_fault`). A rate of
    /// 0 draws nothing, so enabling one fault does not shift another's draws.
    pub(crate) fn fires(&self, fault: Fault, resource: &str) -> bool {
        let rate = self.mode.rate(fault);
        if rate <= 0.0 {
            return false;
        }
        let hit = self.draw() < rate;
        if hit {
            if let Some(on_fault) = &self.mode.on_fault {
                on_fault(fault, resource);
            }
        }
        hit
    }

    /// How late a late renewal goes: up to `lifetime`.
    pub(crate) fn late_by(&self, lifetime: Duration) -> Duration {
        lifetime.mul_f64(self.draw())
    }
}

/// The body of fence-gateway's refusal of a token below the resource's mark, as the test mode
/// answers it (`injected` set).
pub(crate) fn refusal_body(resource: &str) -> Bytes {
    let body = serde_json::json!({
        "type": format!("{}stale-fencing-token", error::PROBLEM_BASE),
        "title": "Conflict",
        "status": 409,
        "detail": format!(
            "injected by the client's test mode: a newer holder of {resource} has written"
        ),
        "injected": true,
    });
    Bytes::from(body.to_string())
}

/// The refusal as the error a 409 answer of it becomes.
pub(crate) fn refusal_error(resource: &str) -> Error {
    error::from_answer(409, &refusal_body(resource))
}

/// The refusal as the answer fence-gateway would have sent (`Fencing-Rejection` set).
pub(crate) fn refusal_response(resource: &str) -> reqwest::Response {
    let mut answer = http::Response::new(refusal_body(resource));
    *answer.status_mut() = http::StatusCode::CONFLICT;
    let headers = answer.headers_mut();
    headers.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/problem+json"),
    );
    headers.insert(
        "fencing-rejection",
        http::HeaderValue::from_static("stale-fencing-token"),
    );
    reqwest::Response::from(answer)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn draws(faults: &Faults, n: usize) -> Vec<bool> {
        (0..n)
            .map(|_| faults.fires(Fault::TokenRefusal, "aisle-1"))
            .collect()
    }

    #[test]
    fn the_same_seed_gives_the_same_faults() {
        let mode = TestMode::new().token_refusal_rate(0.5).seed(42);
        let first = draws(&Faults::new(mode.clone()), 64);
        assert_eq!(first, draws(&Faults::new(mode), 64));
        assert!(first.contains(&true) && first.contains(&false), "{first:?}");
        let other = draws(
            &Faults::new(TestMode::new().token_refusal_rate(0.5).seed(43)),
            64,
        );
        assert_ne!(first, other);
    }

    #[test]
    fn a_rate_of_zero_never_fires_and_one_always_does() {
        let told = Arc::new(Mutex::new(Vec::new()));
        let seen = told.clone();
        let faults = Faults::new(TestMode::new().loss_rate(1.0).on_fault(move |f, r| {
            seen.lock().unwrap().push((f, r.to_owned()));
        }));
        for _ in 0..100 {
            assert!(faults.fires(Fault::Loss, "dock"));
            assert!(!faults.fires(Fault::LateRenewal, "dock"));
            assert!(!faults.fires(Fault::FailedRenewal, "dock"));
            assert!(!faults.fires(Fault::TokenRefusal, "dock"));
        }
        let told = told.lock().unwrap();
        assert_eq!(told.len(), 100);
        assert!(told.iter().all(|(f, r)| *f == Fault::Loss && r == "dock"));
        let late = faults.late_by(Duration::from_secs(2));
        assert!(late <= Duration::from_secs(2));
    }

    #[test]
    fn a_refusal_is_fence_gateways_stale_token_problem() {
        let e = refusal_error("aisle-1");
        assert_eq!(e.slug(), Some("stale-fencing-token"));
        assert!(matches!(e, Error::Problem { status: 409, .. }), "{e:?}");
        let answer = refusal_response("aisle-1");
        assert_eq!(answer.status().as_u16(), 409);
        assert_eq!(answer.headers()["fencing-rejection"], "stale-fencing-token");
    }
}
