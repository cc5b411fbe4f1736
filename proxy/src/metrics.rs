//! The proxy's metrics: OpenTelemetry instruments on one meter per server, served as Prometheus
//! text at `/metrics`. Labels are small closed sets (operation, outcome), never resource names.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use opentelemetry::metrics::{Counter, Histogram, Meter};
use opentelemetry::KeyValue;
use runtime::reload::Reloads;
use runtime::DURATION_BUCKETS;
use tokio::time::Instant;

use crate::error::QuotaKind;

/// The outcomes of a fleet decision.
pub(crate) const FLEET_DECISIONS: [&str; 4] = ["settled", "unsettled", "raced", "failed"];
/// Why the fleet service ends a member's grant.
pub(crate) const FLEET_REVOCATIONS: [&str; 4] = ["deadline", "evicted", "removed", "orphan"];

/// Every instrument the proxy records into.
#[derive(Debug)]
pub(crate) struct Metrics {
    exporter: runtime::telemetry::Metrics,
    /// Leases granted (`lease_proxy_grants_total`).
    pub(crate) grants: Counter<u64>,
    /// Acquires refused because another holder has the resource (`lease_proxy_conflicts_total`).
    pub(crate) conflicts: Counter<u64>,
    /// Renewals, by `outcome`: `renewed` or `lost` (`lease_proxy_renewals_total`).
    pub(crate) renewals: Counter<u64>,
    /// Releases that ended a grant (`lease_proxy_releases_total`).
    pub(crate) releases: Counter<u64>,
    /// Grants made here that ended without a release through this replica
    /// (`lease_proxy_expirations_total`).
    pub(crate) expirations: Counter<u64>,
    /// Requests refused because the grant they name has ended, by `reason`: `lease_lost` (the
    /// proxy found the grant gone) or `enforcer` (the enforcer refused the forwarded write's token)
    /// (`lease_proxy_stale_rejections_total`).
    pub(crate) stale: Counter<u64>,
    /// Forwarded writes, by `outcome`: `2xx`, `3xx`, `4xx`, `5xx` (the upstream's answer) or
    /// `unreachable` / `timeout` (`lease_proxy_forwards_total`).
    pub(crate) forwards: Counter<u64>,
    /// Requests judged by `--auth-tokens`, by `outcome` (`authenticated`, `unauthenticated`,
    /// `forbidden`) and `route` (`acquire`, `read`, `forward`, `v3`)
    /// (`lease_proxy_auth_requests_total`).
    pub(crate) auth: Counter<u64>,
    /// Requests refused by a per-principal quota, by `quota` (a [`QuotaKind`])
    /// (`lease_proxy_quota_refusals_total`).
    pub(crate) quota_refusals: Counter<u64>,
    /// `/v1/watch` streams that went to read an etcd watch of their own, by `reason`:
    /// `overtaken` (the shared feed's ring passed them) or `unreached` (they start where the
    /// ring does not reach) (`lease_proxy_watch_own_total`).
    watch_own: Counter<u64>,
    /// Audit events dropped because the writer's queue was full
    /// (`lease_proxy_audit_dropped_total`).
    pub(crate) audit_dropped: Counter<u64>,
    etcd: Histogram<f64>,
    /// gRPC calls, by `method` and `code` (`lease_proxy_grpc_request_duration_seconds`).
    grpc: Histogram<f64>,
    batch: Histogram<u64>,
    /// Group-commit batches etcd refused as a whole, each of whose transactions was then sent
    /// alone (`lease_proxy_etcd_batch_splits_total`).
    pub(crate) batch_splits: Counter<u64>,
    /// Sessions opened here (`lease_proxy_sessions_opened_total`).
    pub(crate) sessions_opened: Counter<u64>,
    /// Keepalive streams currently open to etcd.
    pub(crate) keepalive_streams: Arc<AtomicI64>,
    /// Bytes of watch answers the replica holds for gRPC clients until written
    /// (`lease_proxy_grpc_watch_held_bytes`), and the most it has held
    /// (`lease_proxy_grpc_watch_held_peak_bytes`).
    pub(crate) watch_held: Arc<AtomicI64>,
    pub(crate) watch_held_peak: Arc<AtomicI64>,
    /// gRPC watch streams ended to keep their answers within a budget, by `budget`: `stream`,
    /// `principal`, `replica`, `too_large` (`lease_proxy_grpc_watch_cut_off_total`).
    watch_cut_off: Counter<u64>,
    /// The fleet service's counters.
    pub(crate) fleet: FleetMetrics,
    /// Files reloaded, by `file` (`key-file`, `tls`, `auth-tokens`) and `outcome` (`loaded`,
    /// `refused`) (`lease_proxy_reloads_total`).
    pub(crate) reloads: Reloads,
}

/// What the fleet service counts.
#[derive(Debug)]
pub(crate) struct FleetMetrics {
    /// Fleet decisions this replica made, by `outcome`: `settled` (every action answered),
    /// `unsettled` (one did not: decided again soon), `raced` (another replica wrote the
    /// assignment first) or `failed` (etcd could not be read or written)
    /// (`lease_proxy_fleet_decisions_total`).
    decisions: Counter<u64>,
    /// Hand-offs begun by assignments this replica wrote (`lease_proxy_fleet_handoffs_total`).
    pub(crate) handoffs: Counter<u64>,
    /// Grants the fleet service made here (`lease_proxy_fleet_grants_total`; also counted in
    /// `lease_proxy_grants_total`).
    pub(crate) grants: Counter<u64>,
    /// Members' grants the fleet service ended here, by `reason`: `deadline`, `evicted`,
    /// `removed`, `orphan` (`lease_proxy_fleet_revocations_total`).
    revocations: Counter<u64>,
}

impl Metrics {
    /// The proxy's instruments on a fresh meter.
    pub(crate) fn new() -> Result<Self, runtime::Error> {
        let exporter = runtime::telemetry::Metrics::new("lease-proxy")?;
        let meter = exporter.meter();
        let counter = |name, description| counter(&meter, name, description);
        let [keepalive_streams, watch_held, watch_held_peak] = gauges(&meter);
        let metrics = Self {
            grants: counter("lease_proxy.grants", "Leases granted."),
            conflicts: counter(
                "lease_proxy.conflicts",
                "Acquires refused because another holder has the resource.",
            ),
            renewals: counter("lease_proxy.renewals", "Renewals, by outcome."),
            releases: counter("lease_proxy.releases", "Releases that ended a grant."),
            expirations: counter(
                "lease_proxy.expirations",
                "Grants made by this replica that ended without a release through it: their TTL ran out.",
            ),
            stale: counter(
                "lease_proxy.stale_rejections",
                "Requests refused because the grant they name has ended, by reason.",
            ),
            forwards: counter("lease_proxy.forwards", "Forwarded writes, by outcome."),
            auth: counter(
                "lease_proxy.auth.requests",
                "Requests judged by the token file, by outcome and route.",
            ),
            quota_refusals: counter(
                "lease_proxy.quota.refusals",
                "Requests refused by a per-principal quota, by quota.",
            ),
            watch_own: counter(
                "lease_proxy.watch.own",
                "Event streams that went to read an etcd watch of their own, by reason.",
            ),
            audit_dropped: counter(
                "lease_proxy.audit.dropped",
                "Audit events dropped because the audit writer's queue was full.",
            ),
            etcd: duration(
                &meter,
                "lease_proxy.etcd.request.duration",
                "Duration of etcd requests, retries included, by operation.",
            ),
            grpc: duration(
                &meter,
                "lease_proxy.grpc.request.duration",
                "Duration of gRPC calls (a stream's whole life), by method and status code.",
            ),
            batch: batch_sizes(&meter),
            batch_splits: counter(
                "lease_proxy.etcd.batch.splits",
                "Group-commit batches etcd refused as a whole, their transactions then sent alone.",
            ),
            sessions_opened: counter("lease_proxy.sessions.opened", "Sessions opened."),
            keepalive_streams,
            watch_held,
            watch_held_peak,
            watch_cut_off: counter(
                "lease_proxy.grpc.watch.cut_off",
                "gRPC watch streams ended to keep their answers within a budget, by budget.",
            ),
            fleet: FleetMetrics::new(&meter),
            reloads: Reloads::new(&meter, "lease_proxy.reloads"),
            exporter,
        };
        metrics.start_at_zero();
        Ok(metrics)
    }

    /// Puts every counter series on `/metrics` at 0, so rates and alerts work from the start.
    fn start_at_zero(&self) {
        for counter in [
            &self.grants,
            &self.conflicts,
            &self.releases,
            &self.expirations,
            &self.audit_dropped,
            &self.batch_splits,
            &self.sessions_opened,
            &self.fleet.handoffs,
            &self.fleet.grants,
        ] {
            counter.add(0, &[]);
        }
        for o in ["renewed", "lost"] {
            self.renewals.add(0, &outcome(o));
        }
        for r in ["lease_lost", "enforcer"] {
            self.stale.add(0, &reason(r));
        }
        for o in ["2xx", "3xx", "4xx", "5xx", "unreachable", "timeout"] {
            self.forwards.add(0, &outcome(o));
        }
        for q in QuotaKind::ALL {
            self.quota_refusals
                .add(0, &[KeyValue::new("quota", q.as_str())]);
        }
        for r in ["overtaken", "unreached"] {
            self.watch_own.add(0, &reason(r));
        }
        for b in ["stream", "principal", "replica", "too_large"] {
            self.watch_cut_off.add(0, &[KeyValue::new("budget", b)]);
        }
        for o in FLEET_DECISIONS {
            self.fleet.decisions.add(0, &outcome(o));
        }
        for r in FLEET_REVOCATIONS {
            self.fleet.revocations.add(0, &reason(r));
        }
        for o in ["authenticated", "unauthenticated", "forbidden"] {
            for route in ["acquire", "read", "forward", "v3"] {
                self.auth_request(o, route, 0);
            }
        }
    }

    /// Counts a fleet decision that came to `outcome` (one of [`FLEET_DECISIONS`]).
    pub(crate) fn fleet_decision(&self, outcome: &'static str) {
        self.fleet.decisions.add(1, &self::outcome(outcome));
    }

    /// Counts a fleet grant ended for `reason` (one of [`FLEET_REVOCATIONS`]).
    pub(crate) fn fleet_revocation(&self, reason: &'static str) {
        self.fleet.revocations.add(1, &self::reason(reason));
    }

    /// Counts an event stream that went to read its own etcd watch, for `reason`.
    pub(crate) fn watch_own(&self, reason: &'static str) {
        self.watch_own.add(1, &self::reason(reason));
    }

    /// Counts a gRPC watch stream ended for going past `budget`.
    pub(crate) fn watch_cut_off(&self, budget: &'static str) {
        self.watch_cut_off
            .add(1, &[KeyValue::new("budget", budget)]);
    }

    /// Counts a request refused by the `quota` quota.
    pub(crate) fn quota_refusal(&self, quota: QuotaKind) {
        self.quota_refusals
            .add(1, &[KeyValue::new("quota", quota.as_str())]);
    }

    /// Counts `n` requests judged `outcome` on a route of class `route`.
    pub(crate) fn auth_request(&self, outcome: &'static str, route: &'static str, n: u64) {
        self.auth.add(
            n,
            &[
                KeyValue::new("outcome", outcome),
                KeyValue::new("route", route),
            ],
        );
    }

    /// The meter, for instruments read from elsewhere (gauges over the holder view).
    pub(crate) fn meter(&self) -> Meter {
        self.exporter.meter()
    }

    /// Records an etcd request of kind `op` that started at `started`.
    pub(crate) fn etcd_request(&self, op: &'static str, started: Instant) {
        self.etcd
            .record(started.elapsed().as_secs_f64(), &[KeyValue::new("op", op)]);
    }

    /// Records a gRPC call of `method` that ended with `code` (a gRPC code's name, or
    /// `cancelled` for a call its client left), started at `started`.
    pub(crate) fn grpc_request(&self, method: &'static str, code: &'static str, started: Instant) {
        let attributes = [KeyValue::new("method", method), KeyValue::new("code", code)];
        self.grpc
            .record(started.elapsed().as_secs_f64(), &attributes);
    }

    /// Records a batch of `n` transactions sent as one proposal.
    pub(crate) fn batch_size(&self, n: usize) {
        self.batch.record(u64::try_from(n).unwrap_or(u64::MAX), &[]);
    }

    /// The `/metrics` answer.
    pub(crate) fn render(&self) -> axum::response::Response {
        runtime::telemetry::render(&self.exporter)
    }
}

impl FleetMetrics {
    fn new(meter: &Meter) -> Self {
        Self {
            decisions: counter(
                meter,
                "lease_proxy.fleet.decisions",
                "Fleet decisions made by this replica, by outcome.",
            ),
            handoffs: counter(
                meter,
                "lease_proxy.fleet.handoffs",
                "Hand-offs begun by fleet assignments this replica wrote.",
            ),
            grants: counter(
                meter,
                "lease_proxy.fleet.grants",
                "Resources granted to fleet members by this replica.",
            ),
            revocations: counter(
                meter,
                "lease_proxy.fleet.revocations",
                "Fleet members' grants ended by this replica's fleet service, by reason.",
            ),
        }
    }
}

fn counter(meter: &Meter, name: &'static str, description: &'static str) -> Counter<u64> {
    meter
        .u64_counter(name)
        .with_description(description)
        .build()
}

/// A histogram of durations in seconds, in the buckets every service here uses.
fn duration(meter: &Meter, name: &'static str, description: &'static str) -> Histogram<f64> {
    meter
        .f64_histogram(name)
        .with_unit("s")
        .with_description(description)
        .with_boundaries(DURATION_BUCKETS.to_vec())
        .build()
}

/// Transactions per proposal sent by group commit.
fn batch_sizes(meter: &Meter) -> Histogram<u64> {
    meter
        .u64_histogram("lease_proxy.etcd.batch.size")
        .with_description("Transactions per proposal sent by group commit (1: sent alone).")
        .with_boundaries(vec![1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0])
        .build()
}

/// The gauges read from counts kept elsewhere: keepalive streams open to etcd, and the bytes of
/// watch answers held for gRPC clients (now, and the most at once).
fn gauges(meter: &Meter) -> [Arc<AtomicI64>; 3] {
    let values = [(); 3].map(|()| Arc::new(AtomicI64::new(0)));
    for ((name, unit, description), value) in [
        (
            "lease_proxy.keepalive.streams",
            "",
            "Keepalive streams open to etcd.",
        ),
        (
            "lease_proxy.grpc.watch.held",
            "By",
            "Bytes of watch answers held for gRPC clients until written.",
        ),
        (
            "lease_proxy.grpc.watch.held.peak",
            "By",
            "The most bytes of watch answers held for gRPC clients at once.",
        ),
    ]
    .into_iter()
    .zip(values.clone())
    {
        let gauge = meter.i64_observable_gauge(name);
        let gauge = if unit.is_empty() {
            gauge
        } else {
            gauge.with_unit(unit)
        };
        gauge
            .with_description(description)
            .with_callback(move |o| o.observe(value.load(Ordering::Relaxed), &[]))
            .build();
    }
    values
}

/// `[KeyValue("outcome", outcome)]`.
pub(crate) fn outcome(outcome: &'static str) -> [KeyValue; 1] {
    [KeyValue::new("outcome", outcome)]
}

/// `[KeyValue("reason", reason)]`.
pub(crate) fn reason(reason: &'static str) -> [KeyValue; 1] {
    [KeyValue::new("reason", reason)]
}
