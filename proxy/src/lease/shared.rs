//! The etcd lease an acquire puts its key on: a spare (granted ahead of demand, or left over by
//! a refused acquire) when one is at hand, else a new grant (see [`super::spares`] for the pool).

use std::time::Duration;

use tokio::time::Instant;

use super::Leases;
use crate::etcd::Granted;
use crate::Result;

/// A spare granted or renewed less than this long ago is handed out without a keepalive: its
/// grant's `expires_in_ms` is measured from that grant, so it is at most this much short of the
/// TTL.
pub(super) const FRESH: Duration = Duration::from_secs(1);

/// Whether a spare whose TTL was (re)started `age` ago may be handed out without a keepalive.
pub(super) fn fresh(age: Duration) -> bool {
    age < FRESH
}

/// The lease an acquire attempt puts its key on: its id, its TTL, and the instant that TTL
/// counts from at the latest (the lease lasts at least `ttl` from there).
#[derive(Debug, Clone, Copy)]
pub(super) struct GrantLease {
    /// The etcd lease (a session's, under a session).
    pub(super) id: i64,
    /// Its TTL, in seconds.
    pub(super) ttl: u64,
    /// When its TTL was last (re)started, at the latest.
    pub(super) counted_from: Instant,
}

impl Leases {
    /// Revokes the spare leases and the wait queue's lease (at shutdown; they would lapse by
    /// their TTL anyway).
    pub(crate) async fn revoke_spares(&self) {
        self.queue.revoke().await;
        let revokes = self
            .spares
            .drain()
            .into_iter()
            .map(|id| self.etcd.revoke(id));
        for result in futures::future::join_all(revokes).await {
            if let Err(e) = result {
                tracing::debug!(error = %e, "spare lease not revoked; it lapses by its TTL");
            }
        }
    }

    /// A lease of `ttl` seconds for an acquire, and the instant its TTL counts from at the
    /// latest (the lease lasts at least `ttl` from there): a spare granted or renewed less than
    /// [`FRESH`] ago as it is (a refill's, under load: no etcd call at all), another spare
    /// renewed now, else a new grant.
    pub(super) async fn lease_for(&self, ttl: u64) -> Result<GrantLease> {
        self.refill(ttl);
        let full = Duration::from_secs(ttl);
        while let Some((id, alive_until)) = self.spares.take(ttl) {
            let counted_from = alive_until.checked_sub(full);
            if let Some(from) = counted_from.filter(|from| fresh(from.elapsed())) {
                return Ok(GrantLease {
                    id,
                    ttl,
                    counted_from: from,
                });
            }
            let renewing = Instant::now();
            match self.keepalive.renew(id).await {
                Ok(renewed) if u64::try_from(renewed).ok() == Some(ttl) => {
                    return Ok(GrantLease {
                        id,
                        ttl,
                        counted_from: renewing,
                    });
                }
                // Lapsed meanwhile (TTL 0): forget it and try the next one.
                Ok(_) => continue,
                Err(e) => {
                    self.etcd.revoke_in_background(id);
                    return Err(e);
                }
            }
        }
        let granting = Instant::now();
        let Granted { id, ttl: granted } = self.etcd.grant(ttl).await?;
        Ok(GrantLease {
            id,
            ttl: u64::try_from(granted).unwrap_or(ttl),
            counted_from: granting,
        })
    }

    /// Grants leases of `ttl` seconds ahead of demand into the spare pool, in the background,
    /// when the pool runs low (see [`spares`]).
    fn refill(&self, ttl: u64) {
        if self.stopping.is_cancelled() {
            return;
        }
        let Some(want) = self.spares.refill(ttl) else {
            return;
        };
        let this = self.clone();
        self.tracker.spawn(async move {
            let grants = (0..want).map(|_| async {
                let granting = Instant::now();
                (this.etcd.grant(ttl).await, granting)
            });
            for (granted, granting) in futures::future::join_all(grants).await {
                match granted {
                    Ok(Granted { id, ttl: granted }) => {
                        let kept = u64::try_from(granted).ok() == Some(ttl)
                            && !this.stopping.is_cancelled()
                            && this
                                .spares
                                .put(ttl, id, granting + Duration::from_secs(ttl));
                        if !kept {
                            this.etcd.revoke_in_background(id);
                        }
                    }
                    Err(e) => tracing::debug!(error = %e, "granting a spare lease failed"),
                }
            }
            this.spares.refilled(ttl);
        });
    }

    /// Keeps a lease that carries no key for reuse, or revokes it when the pool is full.
    pub(super) async fn give_back(&self, lease: &GrantLease) -> Result<()> {
        let alive_until = lease.counted_from + Duration::from_secs(lease.ttl);
        if self.spares.put(lease.ttl, lease.id, alive_until) {
            return Ok(());
        }
        self.etcd.revoke(lease.id).await
    }
}
