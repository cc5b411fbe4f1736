//! A fleet made, changed or ended (`PUT` and `DELETE /v1/fleets/{fleet}`).
//!
//! The spec is written with a compare on its last mod revision, so a change never overwrites
//! one it did not see, and only the principal that made the fleet may change or end it. Ending
//! it deletes every key of the fleet in one guarded delete — after which no grant can be made
//! under it, since each compares the member's record, the spec and the assignment — and only
//! then releases the fleet's grants.
//!
//! What to release is the fleet's index of its grants, `{prefix}fleet-grants/{fleet}/…`: each
//! grant writes its key in its own transaction and each end of a grant deletes it, so it names
//! every grant the fleet made, whatever its spec said when it ended, and it outlives the
//! delete. The delete also writes `{prefix}fleet-ending/{fleet}`, deleted once the index is
//! released: a `DELETE` that finds the fleet gone releases what is left before it answers (a
//! retry, or a second `DELETE` racing the first), and the driver finishes an end that a
//! stopped replica left half-way.
//!
//! With authentication, a principal makes at most `--quota-fleets` fleets: each it makes
//! writes an index key `{prefix}fleet-owners/{principal}/{fleet}` with its spec, counted as the
//! held quota counts grants (`lease::quota`), and the fleet's end deletes it with the rest.

use std::collections::BTreeSet;

use serde::Serialize;
use tracing::Instrument as _;

use super::records::{
    encode, Snapshot, SpecRecord, DEFAULT_DRAIN_MS, MAX_DRAIN_MS, MAX_NAME_BYTES, MAX_RESOURCES,
};
use super::{each, Fleets};
use crate::etcd::{Counted, Unchanged};
use crate::lease::{i64_string, unix_millis, validate};
use crate::{Error, QuotaKind, Result};

/// How many times a request reads again after losing a compare to a concurrent write.
pub(super) const ATTEMPTS: usize = 5;

/// How long a principal refused by the fleet quota is told to wait: a fleet ends when its
/// maker ends it, which the proxy cannot predict.
const FLEETS_RETRY_AFTER_SECS: u64 = 60;

/// A spec as a request gives it.
#[derive(Debug, Clone)]
pub(crate) struct SpecChange {
    /// The resources.
    pub(crate) resources: Vec<String>,
    /// How long a member has to release a resource moved away from it.
    pub(crate) drain_ms: Option<u64>,
    /// Most hand-offs in flight.
    pub(crate) max_moves: Option<u64>,
}

/// A spec as written.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub(crate) struct Written {
    /// The fleet.
    pub(crate) fleet: String,
    /// Its resources, in name order.
    pub(crate) resources: Vec<String>,
    /// How long a member has to release a resource moved away from it, in milliseconds.
    pub(crate) drain_ms: u64,
    /// Most hand-offs in flight at once.
    pub(crate) max_moves: usize,
    /// The etcd revision that wrote the spec (decimal string).
    #[serde(with = "i64_string")]
    #[schema(value_type = String, example = "4711")]
    pub(crate) revision: i64,
}

impl SpecChange {
    /// The resources, checked: each in the resource grammar, none twice, at most
    /// [`MAX_RESOURCES`] of at most [`MAX_NAME_BYTES`] together; and the bounds of the rest.
    pub(crate) fn checked(&self) -> Result<BTreeSet<String>> {
        let invalid = |reason: String| Error::InvalidField {
            field: "resources",
            reason,
        };
        if self.resources.len() > MAX_RESOURCES {
            return Err(invalid(format!(
                "{} resources; a fleet has at most {MAX_RESOURCES}",
                self.resources.len()
            )));
        }
        let bytes: usize = self.resources.iter().map(String::len).sum();
        if bytes > MAX_NAME_BYTES {
            return Err(invalid(format!(
                "{bytes} bytes of names; a fleet's names are at most {MAX_NAME_BYTES} bytes together"
            )));
        }
        let mut set = BTreeSet::new();
        for (i, name) in self.resources.iter().enumerate() {
            validate::resource(name).map_err(|e| Error::InvalidField {
                field: "resource",
                reason: format!("resources[{i}] {}: {e}", shown(name)),
            })?;
            if !set.insert(name.clone()) {
                return Err(invalid(format!(
                    "resources[{i}] {} is listed twice",
                    shown(name)
                )));
            }
        }
        if self.drain_ms.is_some_and(|d| d > MAX_DRAIN_MS) {
            return Err(Error::InvalidField {
                field: "drain_ms",
                reason: format!("at most {MAX_DRAIN_MS}"),
            });
        }
        if self
            .max_moves
            .is_some_and(|m| m == 0 || m > MAX_RESOURCES as u64)
        {
            return Err(Error::InvalidField {
                field: "max_moves",
                reason: format!("1 to {MAX_RESOURCES}"),
            });
        }
        Ok(set)
    }
}

/// The answer for `record`, written at `revision`.
fn written(fleet: &str, record: &SpecRecord, revision: i64) -> Written {
    Written {
        fleet: fleet.to_owned(),
        max_moves: record.max_moves(),
        drain_ms: record.drain_ms,
        resources: record.resources.clone(),
        revision,
    }
}

/// A name as an error message shows it: quoted, and cut to 64 characters.
fn shown(name: &str) -> String {
    let cut: String = name.chars().take(64).collect();
    if cut.len() < name.len() {
        format!("{cut:?}…")
    } else {
        format!("{cut:?}")
    }
}

/// Checks that the caller may act on every resource of a fleet: the front's judgement (403
/// otherwise).
pub(crate) type Gate<'a> = &'a (dyn Fn(&[String]) -> Result<()> + Sync);

impl Fleets {
    /// Makes `fleet`, or changes it, for `principal` (who must be the one that made it).
    /// The caller has been judged allowed to acquire every resource of `change`.
    pub(crate) async fn put(
        &self,
        fleet: &str,
        change: &SpecChange,
        principal: Option<String>,
    ) -> Result<Written> {
        let resources: Vec<String> = change.checked()?.into_iter().collect();
        let key = self.inner.parts.layout.fleet_spec(fleet);
        for _ in 0..ATTEMPTS {
            let current = self.inner.parts.etcd.get(&key).await?;
            let stored = match &current {
                Some(kv) => {
                    let record: SpecRecord =
                        serde_json::from_slice(kv.value()).map_err(|e| Error::CorruptRecord {
                            key: key.clone(),
                            reason: e.to_string(),
                        })?;
                    if principal.is_some() && record.principal != principal {
                        return Err(Error::OtherPrincipalsFleet);
                    }
                    Some(record)
                }
                None => None,
            };
            let record = SpecRecord {
                resources: resources.clone(),
                drain_ms: change.drain_ms.unwrap_or(DEFAULT_DRAIN_MS),
                max_moves: change.max_moves.and_then(|m| usize::try_from(m).ok()),
                // A caller without a principal (a replica without authentication) changes the
                // fleet, never whose it is: its maker still ends it, and its quota's key with it.
                principal: principal
                    .clone()
                    .or_else(|| stored.as_ref().and_then(|s| s.principal.clone())),
                changed_at: crate::lease::unix_millis(),
            };
            if let Some((kv, stored)) = current.as_ref().zip(stored.as_ref()) {
                if stored.same_as(&record) {
                    // Nothing to change: nothing written, so a client repeating its spec
                    // neither grows etcd's history nor makes every replica decide again.
                    return Ok(written(fleet, stored, kv.mod_revision()));
                }
            }
            let guard = Unchanged {
                key: &key,
                mod_revision: current.as_ref().map_or(0, |kv| kv.mod_revision()),
            };
            let counted = match (&current, &principal) {
                (None, Some(principal)) => self.count_fleets(principal, fleet).await?,
                _ => None,
            };
            let written = self
                .inner
                .parts
                .commit
                .put_if_counted(
                    &key,
                    &encode(&record),
                    0,
                    &[guard],
                    counted.as_ref().map(Counted::guard),
                )
                .await?;
            if let Some(revision) = written {
                tracing::info!(%fleet, resources = resources.len(), "fleet spec written");
                return Ok(self::written(fleet, &record, revision));
            }
        }
        Err(Error::FleetChanged)
    }

    /// Counts the fleets `principal` has made, for making `fleet` under its quota: `None` when
    /// no quota applies, [`Error::QuotaExceeded`] when it has made its quota already. The
    /// spec is then written with its index key, only if no other was written since the count.
    async fn count_fleets(&self, principal: &str, fleet: &str) -> Result<Option<Counted>> {
        let Some(max) = self.inner.parts.quota else {
            return Ok(None);
        };
        let layout = &self.inner.parts.layout;
        let counted = self
            .inner
            .parts
            .etcd
            .count_quota(
                layout.fleet_owners(principal),
                layout.fleet_owner(principal, fleet),
            )
            .await?;
        if usize::try_from(counted.count).unwrap_or(usize::MAX) >= max {
            return Err(Error::QuotaExceeded {
                quota: QuotaKind::Fleets,
                retry_after: FLEETS_RETRY_AFTER_SECS,
            });
        }
        Ok(Some(counted))
    }

    /// Ends `fleet`: its keys go, then its grants are released. Idempotent (no such fleet: its
    /// grants left by an end that did not finish are released, then done). Only `principal`
    /// (the one that made it) may, and `gate` judges the caller for its resources.
    pub(crate) async fn delete(
        &self,
        fleet: &str,
        principal: Option<&str>,
        gate: Gate<'_>,
    ) -> Result<()> {
        for _ in 0..ATTEMPTS {
            let Some(snap) = self.snapshot(fleet).await? else {
                // Ended already, perhaps by a request still releasing, or by a replica that
                // stopped half-way: this answer too waits until the grants are gone.
                let (this, fleet) = (self.clone(), fleet.to_owned());
                return self
                    .unstoppable(async move { this.release_ended(&fleet).await })
                    .await;
            };
            // Judged first: a caller that may not act on the fleet's resources learns nothing
            // of it, not even whose it is.
            gate(&snap.spec.record.resources)?;
            if principal.is_some() && snap.spec.record.principal.as_deref() != principal {
                return Err(Error::OtherPrincipalsFleet);
            }
            let this = self.clone();
            if self
                .unstoppable(async move { this.end(&snap).await })
                .await?
            {
                tracing::info!(%fleet, "fleet ended");
                return Ok(());
            }
        }
        Err(Error::FleetChanged)
    }

    /// Runs `work` in a task of the service's own, and waits for its answer: once a fleet's
    /// keys are deleted only its index says what to release, so a caller going away must not
    /// stop that half-way. (As an acquire's attempt is, in `lease/attempt.rs`; in the
    /// request's span, so its etcd calls join the request's trace.)
    async fn unstoppable<T: Send + 'static>(
        &self,
        work: impl std::future::Future<Output = Result<T>> + Send + 'static,
    ) -> Result<T> {
        let (answer, answered) = tokio::sync::oneshot::channel();
        self.inner.tracker.spawn(
            async move {
                let _ = answer.send(work.await);
            }
            .in_current_span(),
        );
        answered.await.unwrap_or(Err(Error::ShuttingDown))
    }

    /// Ends the fleet `snap` read, if its spec is still the one read (`false` otherwise): its
    /// keys go in one guarded delete that marks the fleet as ending, then its grants are
    /// released.
    pub(super) async fn end(&self, snap: &Snapshot) -> Result<bool> {
        if self.end_keys(snap).await?.is_none() {
            return Ok(false);
        }
        self.release_ended(&snap.fleet).await?;
        Ok(true)
    }

    /// The first step of [`Fleets::end`]: the fleet's keys deleted if its spec is unchanged,
    /// and `{prefix}fleet-ending/{fleet}` written in the same revision (its value the Unix ms
    /// it began at); that revision, `None` if the spec had changed. After it no grant can be
    /// made under the fleet: each compares the member's record, the spec and the assignment.
    pub(super) async fn end_keys(&self, snap: &Snapshot) -> Result<Option<i64>> {
        let layout = &self.inner.parts.layout;
        let guard = Unchanged {
            key: &layout.fleet_spec(&snap.fleet),
            mod_revision: snap.spec.mod_revision,
        };
        let owner =
            (snap.spec.record.principal.as_deref()).map(|p| layout.fleet_owner(p, &snap.fleet));
        let (ending, began) = (layout.fleet_ending(&snap.fleet), unix_millis().to_string());
        self.inner
            .parts
            .etcd
            .delete_prefix_if(
                &layout.fleet(&snap.fleet),
                owner.as_deref(),
                (&ending, began.as_bytes()),
                guard,
            )
            .await
    }

    /// Releases every grant an ended incarnation of `fleet` made: those its index names,
    /// written before the end's revision (a fleet of the same name made since has its own),
    /// each only if still that grant; then its end's key goes.
    ///
    /// An index key's *mod* revision is its grant's token: the grant's transaction puts it, and
    /// nothing else writes it while that grant lives. Its create revision may be an earlier
    /// grant's, whose key a withdrawal or a lost answer left behind. Safe to repeat and to run on
    /// several replicas at once: nothing if `fleet` is not ending.
    pub(super) async fn release_ended(&self, fleet: &str) -> Result<()> {
        let (parts, layout) = (&self.inner.parts, &self.inner.parts.layout);
        let ending = layout.fleet_ending(fleet);
        let Some(mark) = parts.etcd.get(&ending).await? else {
            return Ok(());
        };
        let ended_at = mark.mod_revision();
        let index = parts.etcd.list(&layout.fleet_grants(fleet), 1_000).await?;
        let prefix = layout.fleet_grants(fleet);
        let mut ends = Vec::new();
        for kv in &index.kvs {
            let key = std::str::from_utf8(kv.key()).ok();
            let resource = key.and_then(|k| k.strip_prefix(&prefix));
            let (Some(key), Some(resource)) = (key, resource) else {
                continue;
            };
            if kv.mod_revision() >= ended_at {
                continue;
            }
            let principal = std::str::from_utf8(kv.value())
                .ok()
                .filter(|p| !p.is_empty());
            ends.push(async move {
                let (revision, lease) = (kv.mod_revision(), kv.lease());
                let revoked = (parts.leases)
                    .revoke_assigned((fleet, resource), revision, lease, principal)
                    .await?;
                if !revoked {
                    // Ended already (released, or its session gone): only the index is left.
                    let unchanged = Unchanged {
                        key,
                        mod_revision: kv.mod_revision(),
                    };
                    parts.etcd.delete_if_unchanged(unchanged).await?;
                }
                Ok(())
            });
        }
        // Each tried: the first error, if any, is the answer; what it left ends with the next
        // try, or with its member's session.
        each(ends).await.into_iter().collect::<Result<Vec<_>>>()?;
        let unchanged = Unchanged {
            key: &ending,
            mod_revision: ended_at,
        };
        parts.etcd.delete_if_unchanged(unchanged).await?;
        tracing::debug!(%fleet, "an ended fleet's grants are released");
        Ok(())
    }

    /// Finishes every fleet's end that began more than `grace` ago and has not finished: the
    /// ones whose replica stopped half-way. The driver calls it now and then.
    pub(super) async fn finish_ends(&self, grace: std::time::Duration) -> Result<()> {
        let layout = &self.inner.parts.layout;
        let listed = (self.inner.parts.etcd)
            .list(layout.fleets_ending(), 1_000)
            .await?;
        let now = u128::from(unix_millis());
        for kv in &listed.kvs {
            let began = std::str::from_utf8(kv.value())
                .ok()
                .and_then(|v| v.parse::<u128>().ok())
                .unwrap_or(0);
            let fleet = std::str::from_utf8(kv.key())
                .ok()
                .and_then(|k| k.strip_prefix(layout.fleets_ending()));
            if let Some(fleet) = fleet.filter(|_| now.saturating_sub(began) >= grace.as_millis()) {
                tracing::info!(%fleet, "finishing a fleet's end another replica left half-way");
                self.release_ended(fleet).await?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(resources: &[&str]) -> SpecChange {
        SpecChange {
            resources: resources.iter().map(|r| (*r).to_owned()).collect(),
            drain_ms: None,
            max_moves: None,
        }
    }

    #[test]
    fn a_spec_is_checked_before_anything_is_written() {
        assert_eq!(change(&["b", "a"]).checked().unwrap().len(), 2);
        assert!(change(&[]).checked().unwrap().is_empty());
        let kind = |c: &SpecChange| match c.checked() {
            Err(Error::InvalidField { field, .. }) => field,
            other => panic!("{other:?}"),
        };
        assert_eq!(kind(&change(&["a", "a"])), "resources");
        assert_eq!(kind(&change(&["a", "../etc"])), "resource");
        assert_eq!(kind(&change(&["a/b"])), "resource");
        let many: Vec<String> = (0..=MAX_RESOURCES).map(|i| format!("r{i}")).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        assert_eq!(kind(&change(&many)), "resources");
        let long = "x".repeat(200);
        let fat: Vec<&str> = std::iter::repeat_n(long.as_str(), 4_000).collect();
        assert_eq!(kind(&change(&fat)), "resources");
        let mut c = change(&["a"]);
        c.drain_ms = Some(MAX_DRAIN_MS + 1);
        assert_eq!(kind(&c), "drain_ms");
        c.drain_ms = Some(0);
        c.max_moves = Some(0);
        assert_eq!(kind(&c), "max_moves");
        // A hostile name is shown cut short.
        let hostile = format!("{}/", "y".repeat(10_000));
        match change(&[&hostile]).checked() {
            Err(e) => assert!(e.to_string().len() < 300, "{e}"),
            Ok(_) => panic!("accepted"),
        }
    }
}
