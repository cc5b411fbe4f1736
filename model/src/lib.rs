//! The safety protocols of lease-proxy and fence-gateway, model-checked with
//! [stateright](https://docs.rs/stateright): explicit-state, breadth-first, every interleaving of
//! the protocol's steps within the bounds. Each model calls the pure decisions the servers call
//! (`fencing::decide`, `lease_proxy::model`), so a change to a decision changes what is
//! checked. docs/MODEL.md maps each action to the code that implements it.
//!
//! - [`admission`]: the enforcer's admission (one gateway; two sharing PostgreSQL).
//! - [`lease`]: the lease lifecycle (acquire, renew, release, expiry, sessions).
//! - [`fleet`]: fleet hand-off.
//!
//! [`check`] runs a model to the end of its bounds and renders every counterexample as a
//! readable trace.
#![forbid(unsafe_code)]

pub mod admission;
pub mod fleet;
pub mod lease;

use std::fmt::Debug;
use std::hash::Hash;
use std::time::Duration;

use stateright::{Checker, Expectation, HasDiscoveries, Model};

/// What a check found.
#[derive(Debug)]
pub struct Checked {
    /// States generated, repeats included.
    pub states: usize,
    /// Distinct states.
    pub unique: usize,
    /// The deepest path explored.
    pub depth: usize,
    /// How long the check took.
    pub elapsed: Duration,
    /// Each violated property (`always` or `eventually`) with its counterexample, rendered.
    pub violations: Vec<(&'static str, String)>,
    /// `sometimes` properties never met: the model did not reach what it should.
    pub unmet: Vec<&'static str>,
}

impl Checked {
    /// One line: the counts and the time.
    pub fn summary(&self) -> String {
        format!(
            "{} states ({} distinct), depth {}, {:.1} s",
            self.states,
            self.unique,
            self.depth,
            self.elapsed.as_secs_f64()
        )
    }

    /// The counterexample of `property`, if it was violated.
    pub fn trace(&self, property: &str) -> Option<&str> {
        self.violations
            .iter()
            .find(|(name, _)| *name == property)
            .map(|(_, trace)| trace.as_str())
    }

    /// The counterexample of `property`; panics, naming what was found instead, if it held.
    pub fn counterexample(&self, property: &str) -> &str {
        self.trace(property)
            .unwrap_or_else(|| panic!("{property}: not caught; found {:?}", self.violations))
    }

    /// Panics with the first violated property's counterexample, or with the `sometimes`
    /// properties never met.
    pub fn assert_holds(&self) {
        if let Some((name, trace)) = self.violations.first() {
            panic!("{name} violated:\n{trace}");
        }
        assert!(self.unmet.is_empty(), "never reached: {:?}", self.unmet);
    }
}

/// How a model's steps are told.
pub type Describe<M> =
    fn(&M, &<M as Model>::State, <M as Model>::Action, &<M as Model>::State) -> String;

/// Checks `model` breadth-first to the end of its bounds (or, with `stop_at_failure`, until the
/// first violation: the shortest counterexample), on `MODEL_THREADS` threads (default 1).
pub fn check<M>(model: M, describe: Describe<M>, stop_at_failure: bool) -> Checked
where
    M: Model + Clone + Send + Sync + 'static,
    M::State: Clone + Debug + Hash + PartialEq + Send + Sync,
    M::Action: Clone + Debug + PartialEq,
{
    let threads = std::env::var("MODEL_THREADS")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or(1);
    // The checker's own run time, for the report: a real clock on purpose.
    #[allow(clippy::disallowed_types)]
    let started = std::time::Instant::now();
    let mut builder = model.clone().checker().threads(threads);
    if stop_at_failure {
        builder = builder.finish_when(HasDiscoveries::AnyFailures);
    }
    let checker = builder.spawn_bfs().join();
    let elapsed = started.elapsed();
    let discoveries = checker.discoveries();
    let mut violations = Vec::new();
    let mut unmet = Vec::new();
    for property in model.properties() {
        let found = discoveries.get(property.name);
        match (property.expectation, found) {
            (Expectation::Sometimes, None) if !stop_at_failure => unmet.push(property.name),
            (Expectation::Always | Expectation::Eventually, Some(path)) => {
                violations.push((property.name, render(&model, describe, path.clone())));
            }
            _ => {}
        }
    }
    Checked {
        states: checker.state_count(),
        unique: checker.unique_state_count(),
        depth: checker.max_depth(),
        elapsed,
        violations,
        unmet,
    }
}

/// One line per step of `path`.
fn render<M>(
    model: &M,
    describe: Describe<M>,
    path: stateright::Path<M::State, M::Action>,
) -> String
where
    M: Model,
    M::Action: Clone,
{
    let steps = path.into_vec();
    let mut out = String::new();
    for pair in steps.windows(2) {
        if let [(before, Some(action)), (after, _)] = pair {
            out.push_str(&describe(model, before, action.clone(), after));
            out.push('\n');
        }
    }
    out
}
