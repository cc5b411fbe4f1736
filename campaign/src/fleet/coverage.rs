//! Who owns each of the fleet's resources, sampled straight from etcd (not through the faulted
//! paths) every [`EVERY`]: the ownership key of each resource — its holder, the session it lives
//! on, its create revision (the token) — and which members' sessions are live then (running,
//! not stopped, per the harness).
//!
//! From the samples, pure functions give the coverage — the share of resource-seconds owned by a
//! live member, and the longest gap per resource — and the hand-overs no grant may make: the
//! same grant (create revision) on another member's session means a grant was made over a
//! holder's without its revocation first.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::GetOptions;
use serde::{Deserialize, Serialize};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::{Members, FLEET};

/// How often ownership is sampled.
pub const EVERY: Duration = Duration::from_millis(100);

/// The ownership keys' prefix (the proxies run with the default `--etcd-prefix`).
const HOLDERS: &str = "/lease-proxy/holders/";

/// A resource's owner in a sample: a grant of the fleet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    /// The member (the grant's holder).
    pub member: String,
    /// The session it lives on.
    pub lease: i64,
    /// The grant's create revision: its token.
    pub create_revision: i64,
}

/// One sample.
#[derive(Debug, Clone)]
pub struct Sample {
    /// When it was read.
    pub at: Instant,
    /// Resource → its owner, for the resources the fleet's grants hold.
    pub owners: BTreeMap<String, Owner>,
    /// The live members' sessions then.
    pub live: BTreeSet<i64>,
}

impl Sample {
    fn owned(&self, resource: &str) -> bool {
        self.owners
            .get(resource)
            .is_some_and(|o| self.live.contains(&o.lease))
    }
}

/// The sampler, running.
pub struct Sampler {
    samples: Arc<Mutex<Vec<Sample>>>,
    task: JoinHandle<()>,
}

impl Sampler {
    /// Samples the ownership keys of the resources named `{prefix}…` through `etcd`, and the
    /// live sessions of `members`, every [`EVERY`]. A read that fails or takes longer than the
    /// period is skipped: the previous sample stands for its time.
    pub fn start(mut etcd: etcd_client::Client, prefix: &str, members: Arc<Members>) -> Self {
        let samples: Arc<Mutex<Vec<Sample>>> = Arc::default();
        let into = samples.clone();
        let key = format!("{HOLDERS}{prefix}");
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            loop {
                tick.tick().await;
                let options = GetOptions::new().with_prefix().with_serializable();
                let read = tokio::time::timeout(EVERY, etcd.get(key.clone(), Some(options))).await;
                let Ok(Ok(resp)) = read else { continue };
                let live = members.live_sessions();
                let owners = resp.kvs().iter().filter_map(owner).collect();
                if let Ok(mut s) = into.lock() {
                    s.push(Sample {
                        at: Instant::now(),
                        owners,
                        live,
                    });
                }
            }
        });
        Self { samples, task }
    }

    /// Stops sampling; every sample taken.
    pub fn stop(self) -> Vec<Sample> {
        self.task.abort();
        self.samples.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

/// The resource and owner an ownership key names, if it is a grant of the fleet.
fn owner(kv: &etcd_client::KeyValue) -> Option<(String, Owner)> {
    let resource = kv.key_str().ok()?.strip_prefix(HOLDERS)?.to_owned();
    let record: serde_json::Value = serde_json::from_slice(kv.value()).ok()?;
    if record["fleet"].as_str() != Some(FLEET) {
        return None;
    }
    Some((
        resource,
        Owner {
            member: record["holder"].as_str()?.to_owned(),
            lease: record["lease_id"].as_str()?.parse().ok()?,
            create_revision: kv.create_revision(),
        },
    ))
}

/// How well the fleet kept its resources owned.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Coverage {
    /// When every resource was first owned by a live member, in seconds after the run started
    /// (the window opens then; `None`: never, and nothing below is measured).
    pub settled_s: Option<f64>,
    /// The window: from then to the last sample, in seconds.
    pub window_s: f64,
    /// Share of the window's resource-seconds owned by a live member.
    pub owned: f64,
    /// Per resource, the longest stretch within the window without a live owner, in
    /// milliseconds (between the samples that saw it go and come back).
    pub longest_gap_ms: BTreeMap<String, u64>,
    /// Samples taken.
    pub samples: usize,
}

/// The coverage of `resources` in `samples` (in time order), for a run that started at
/// `started`.
pub fn coverage(samples: &[Sample], resources: &[String], started: Instant) -> Coverage {
    let settled = samples
        .iter()
        .position(|s| resources.iter().all(|r| s.owned(r)));
    let Some(first) = settled else {
        return Coverage {
            samples: samples.len(),
            ..Coverage::default()
        };
    };
    let window = &samples[first..];
    let (Some(open), Some(close)) = (window.first(), window.last()) else {
        return Coverage::default();
    };
    let mut owned_ms = 0.0;
    let mut longest: BTreeMap<String, u64> = resources.iter().map(|r| (r.clone(), 0)).collect();
    let mut gone: BTreeMap<&str, Instant> = BTreeMap::new();
    for (i, s) in window.iter().enumerate() {
        let next = window.get(i + 1).map_or(s.at, |n| n.at);
        let span = next.duration_since(s.at).as_secs_f64() * 1e3;
        for r in resources {
            if s.owned(r) {
                owned_ms += span;
                if let Some(since) = gone.remove(r.as_str()) {
                    note(&mut longest, r, s.at.duration_since(since));
                }
            } else {
                gone.entry(r.as_str()).or_insert(s.at);
            }
        }
    }
    for (r, since) in gone {
        note(&mut longest, r, close.at.duration_since(since));
    }
    let window_ms = close.at.duration_since(open.at).as_secs_f64() * 1e3;
    Coverage {
        settled_s: Some(open.at.duration_since(started).as_secs_f64()),
        window_s: window_ms / 1e3,
        owned: if window_ms > 0.0 {
            owned_ms / (window_ms * resources.len().max(1) as f64)
        } else {
            1.0
        },
        longest_gap_ms: longest,
        samples: samples.len(),
    }
}

fn note(longest: &mut BTreeMap<String, u64>, resource: &str, gap: Duration) {
    let ms = u64::try_from(gap.as_millis()).unwrap_or(u64::MAX);
    let l = longest.entry(resource.to_owned()).or_default();
    *l = (*l).max(ms);
}

/// Every grant seen on another member's session than the one it was made on: the ownership key
/// was overwritten where it should have been released or revoked, then created anew (with a
/// new token) for the next member.
pub fn handovers(samples: &[Sample]) -> Vec<String> {
    let mut last: BTreeMap<&str, &Owner> = BTreeMap::new();
    let mut found = BTreeSet::new();
    for s in samples {
        for (r, o) in &s.owners {
            if let Some(before) = last.insert(r.as_str(), o) {
                if before.create_revision == o.create_revision && before.lease != o.lease {
                    found.insert(format!(
                        "handover: {r} passed from {} to {} under the same grant (token {}): \
                         granted while held, without a revocation first",
                        before.member, o.member, o.create_revision
                    ));
                }
            }
        }
    }
    found.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(at: Instant, owners: &[(&str, &str, i64, i64)], live: &[i64]) -> Sample {
        Sample {
            at,
            owners: owners
                .iter()
                .map(|(r, m, lease, rev)| {
                    (
                        (*r).to_owned(),
                        Owner {
                            member: (*m).to_owned(),
                            lease: *lease,
                            create_revision: *rev,
                        },
                    )
                })
                .collect(),
            live: live.iter().copied().collect(),
        }
    }

    #[test]
    fn coverage_counts_live_owners_from_the_first_full_sample() {
        let t0 = Instant::now();
        let t = |ms| t0 + Duration::from_millis(ms);
        let resources = vec!["a".to_owned(), "b".to_owned()];
        let samples = vec![
            // Not yet settled: b has no owner.
            sample(t(0), &[("a", "m0", 1, 10)], &[1]),
            sample(t(100), &[("a", "m0", 1, 10), ("b", "m1", 2, 11)], &[1, 2]),
            // m1 stopped: its grant is still there, but it is not a live owner.
            sample(t(200), &[("a", "m0", 1, 10), ("b", "m1", 2, 11)], &[1]),
            sample(t(300), &[("a", "m0", 1, 10)], &[1]),
            sample(t(400), &[("a", "m0", 1, 10), ("b", "m0", 1, 15)], &[1]),
            sample(t(500), &[("a", "m0", 1, 10), ("b", "m0", 1, 15)], &[1]),
        ];
        let c = coverage(&samples, &resources, t0);
        assert_eq!(c.settled_s, Some(0.1));
        assert!((c.window_s - 0.4).abs() < 1e-9);
        // a: 400 of 400 ms; b: 100 + 100 of 400 ms.
        assert!((c.owned - 600.0 / 800.0).abs() < 1e-9, "{c:?}");
        assert_eq!(c.longest_gap_ms["a"], 0);
        assert_eq!(c.longest_gap_ms["b"], 200);
        assert!(handovers(&samples).is_empty());
    }

    #[test]
    fn a_grant_moved_to_another_session_is_a_handover() {
        let t0 = Instant::now();
        let samples = vec![
            sample(t0, &[("a", "m0", 1, 10)], &[1, 2]),
            sample(t0, &[("a", "m1", 2, 10)], &[1, 2]),
            // A new grant (a new create revision) is not.
            sample(t0, &[("a", "m0", 1, 12)], &[1, 2]),
        ];
        let found = handovers(&samples);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].starts_with("handover: a passed from m0 to m1"));
        assert!(coverage(&samples, &["x".to_owned()], t0)
            .settled_s
            .is_none());
    }
}
