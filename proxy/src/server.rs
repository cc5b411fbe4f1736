//! Running the proxy: wiring, serving, and the shutdown sequence.
//!
//! Shutdown, once the `shutdown` future resolves (SIGTERM in the binary): `/readyz` turns 503 and
//! serving goes on for `shutdown_delay` (load balancers stop sending); then waiting acquires give
//! up, the listener stops accepting, in-flight requests finish under `drain_timeout`, and the
//! background streams are cancelled and joined.

use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use fencing::{KeyId, Keyring, Keys};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::api::{self, AppState};
use crate::audit::Audit;
use crate::auth::Auth;
use crate::etcd::{Access, Batching, Etcd, GroupCommit, KeepAlive};
use crate::lease::{Holders, Leases, Limits};
use crate::metrics::Metrics;
use crate::prefence::{Database, Prefence};
use crate::upstream::Upstream;
use crate::Config;

/// Why the proxy could not start or serve.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// The fencing key file is unusable.
    #[error(transparent)]
    Keys(#[from] fencing::Error),
    /// The development key could not be written.
    #[error("cannot write the development key {path}: {source}")]
    DevKey {
        /// Where it was to be written.
        path: PathBuf,
        /// Why not.
        #[source]
        source: std::io::Error,
    },
    /// The token file is unusable.
    #[error("{0}")]
    Auth(String),
    /// The audit log could not be opened.
    #[error("cannot open the audit log {path}: {source}")]
    AuditLog {
        /// The file.
        path: PathBuf,
        /// Why not.
        #[source]
        source: std::io::Error,
    },
    /// The metrics could not be set up.
    #[error("metrics: {0}")]
    Metrics(#[source] runtime::Error),
    /// A TLS certificate, key or CA file is unusable.
    #[error("TLS: {0}")]
    Tls(#[source] runtime::Error),
    /// The pre-fence database cannot be used.
    #[error("{0}")]
    Prefence(String),
    /// The etcd credentials or TLS files are unusable.
    #[error("etcd access: {0}")]
    EtcdAccess(String),
    /// The etcd client could not be built.
    #[error("etcd: {0}")]
    Etcd(#[from] crate::Error),
    /// Serving failed.
    #[error("serving: {0}")]
    Serve(#[from] std::io::Error),
}

/// Loads the key file, or generates (once) and loads a development key in the data directory;
/// either file can be reloaded ([`Keys::watch`]).
pub fn load_keys(config: &Config) -> Result<Keys, StartError> {
    if let Some(path) = &config.key_file {
        return Ok(Keys::load(path)?);
    }
    let path = config.data_dir.join("dev-fencing.key");
    if !path.exists() {
        let kid = KeyId::parse("dev").ok_or_else(|| StartError::DevKey {
            path: path.clone(),
            source: std::io::Error::other("invalid key id"),
        })?;
        Keyring::create_file(&path, &kid)?;
    }
    tracing::warn!(
        path = %path.display(),
        "NO --key-file GIVEN: using a generated DEVELOPMENT fencing key. Enforcers must share \
         this file to verify tokens; give every proxy and gateway the same --key-file in production"
    );
    Ok(Keys::load(&path)?)
}

/// A client for an already validated `http(s)://` URL setting.
fn upstream(
    url: &Option<String>,
    config: &Config,
    metrics: &Arc<Metrics>,
) -> Result<Option<Upstream>, StartError> {
    url.as_ref()
        .and_then(|u| u.parse().ok())
        .map(|base| {
            Upstream::new(
                base,
                config.forward_timeout,
                metrics.clone(),
                &config.upstream_tls(),
            )
        })
        .transpose()
        .map_err(StartError::Tls)
}

/// Where grants are pre-fenced: the enforcer, the database, both or neither.
fn prefence(config: &Config, metrics: &Arc<Metrics>) -> Result<Prefence, StartError> {
    let database = config
        .prefence_database_url
        .as_deref()
        .map(|url| {
            Database::new(
                url,
                &config.prefence_database_schema,
                config.forward_timeout,
            )
        })
        .transpose()
        .map_err(StartError::Prefence)?;
    Ok(Prefence {
        http: upstream(&config.prefence_url, config, metrics)?,
        database,
    })
}

/// Who may be granted a fleet's resources: with `--auth-tokens`, a principal the file in force
/// lets acquire every one of them (judged whenever a fleet decides, so a reload that narrows a
/// principal takes its members' resources away); without, anyone.
fn entitlement(auth: Option<Arc<Auth>>) -> crate::fleet::Entitlement {
    match auth {
        Some(auth) => Arc::new(move |principal: Option<&str>, resources: &[String]| {
            principal.is_some_and(|p| auth.named_may_all(p, crate::auth::Op::Acquire, resources))
        }),
        None => Arc::new(|_: Option<&str>, _: &[String]| true),
    }
}

/// The replica's tasks: `background` ones (etcd's connection, keepalives, group commit, the
/// audit writer, reloads) stop after the drain; `stopping` tells request-bound work (waits,
/// streams, fleet decisions) the drain has begun.
struct Tasks {
    tracker: TaskTracker,
    background: CancellationToken,
    stopping: CancellationToken,
}

/// What every part of the replica is built on: etcd, the keys, who may do what, the audit.
struct Base {
    etcd: Etcd,
    keepalive: KeepAlive,
    keys: Keys,
    auth: Option<Arc<Auth>>,
    tls: Option<Arc<runtime::tls::ServerTls>>,
    metrics: Arc<Metrics>,
    audit: Audit,
}

/// Serves the proxy on `listener` until `shutdown` resolves, then drains and returns.
pub async fn run(
    listener: TcpListener,
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), StartError> {
    let tasks = Tasks {
        tracker: TaskTracker::new(),
        background: CancellationToken::new(),
        stopping: CancellationToken::new(),
    };
    // However `run` returns (a failed start included), the background tasks are told to stop.
    let _stop_background = tasks.background.clone().drop_guard();
    let base = connect(&config, &tasks).await?;
    let tls = base.tls.clone();
    let (state, app) = assemble(&config, base, &tasks)?;
    tracing::info!(listen = %listener.local_addr()?, https = tls.is_some(), endpoints = ?config.etcd_endpoints, "lease-proxy serving");
    let result = runtime::serve::until_shutdown(
        runtime::serve::Listener { tcp: listener, tls },
        app,
        shutdown,
        &state.draining,
        tasks.stopping.clone(),
        config.drain(),
        config.connection_limits(),
    )
    .await;
    tasks.stopping.cancel();
    state.leases.revoke_spares().await;
    tasks.background.cancel();
    tasks.tracker.close();
    tasks.tracker.wait().await;
    tracing::info!("stopped");
    result.map_err(StartError::Serve)
}

/// Loads the keys, the token file and the certificates (each watched for reloads), dials etcd
/// and starts the keepalive streams and the audit writer.
async fn connect(config: &Config, tasks: &Tasks) -> Result<Base, StartError> {
    let (tracker, background) = (&tasks.tracker, &tasks.background);
    let keys = load_keys(config)?;
    let metrics = Arc::new(Metrics::new().map_err(StartError::Metrics)?);
    // Watched from the start, so SIGHUP (whose default action ends the process) is handled
    // from here on, while etcd is still being dialled too.
    keys.watch(&metrics.reloads, tracker, background.clone());
    let auth = match &config.auth_tokens {
        Some(path) => Some(Arc::new(
            Auth::load(path, config.tls_client_principal).map_err(StartError::Auth)?,
        )),
        None => None,
    };
    let tls = config
        .server_tls()
        .map(|files| runtime::tls::ServerTls::load(files).map(Arc::new))
        .transpose()
        .map_err(StartError::Tls)?;
    let access = config
        .etcd_credentials()
        .map_err(|e| e.0)
        .and_then(|user| Access::new(&config.etcd_endpoints, &config.etcd_tls(), user))
        .map_err(StartError::EtcdAccess)?;
    let etcd = Etcd::connect(
        &config.etcd_endpoints,
        config.etcd_timeout,
        metrics.clone(),
        &access,
        tracker,
        background.clone(),
    )
    .await?;
    if let Some(tls) = &tls {
        tls.watch(&metrics.reloads, tracker, background.clone());
    }
    let keepalive = KeepAlive::start(&etcd, config.keepalive_streams, tracker, background.clone());
    if let Some(auth) = &auth {
        auth.watch(&metrics.reloads, tracker, background.clone());
    }
    // The writer outlives the drain (cancelled with the other background tasks), so the
    // events of requests finishing during it are written.
    let audit = match &config.audit_log {
        Some(path) => Audit::start(path, metrics.clone(), tracker, background.clone())
            .await
            .map_err(|source| StartError::AuditLog {
                path: path.clone(),
                source,
            })?,
        None => Audit::off(metrics.clone()),
    };
    Ok(Base {
        etcd,
        keepalive,
        keys,
        auth,
        tls,
        metrics,
        audit,
    })
}

/// The services on `base` — etcd's API, the lease and fleet services — and the routes that
/// serve them: the HTTP API and `/v3`, with etcd's gRPC API beside them.
fn assemble(
    config: &Config,
    base: Base,
    tasks: &Tasks,
) -> Result<(Arc<AppState>, axum::Router), StartError> {
    let watch_slots = watch_slots(config, &base.metrics);
    let etcd_core = etcd_api(config, &base, watch_slots.clone(), tasks);
    let judge =
        crate::auth::Judge::new(base.auth.clone(), base.metrics.clone(), base.audit.clone());
    let v3 = Arc::new(crate::v3::V3::new(
        etcd_core.clone(),
        judge.clone(),
        base.etcd.clone(),
        crate::v3::Settings {
            max_body: config.max_body_bytes,
            body_deadline: config.header_read_timeout,
        },
    ));
    let (leases, fleets) = services(config, &base, tasks)?;
    let Base {
        etcd,
        auth,
        metrics,
        audit,
        ..
    } = base;
    let state = Arc::new(AppState {
        upstream: upstream(&config.upstream, config, &metrics)?,
        max_forward_bytes: config.max_forward_bytes,
        leases,
        fleets,
        etcd,
        readiness_key: config.layout().readiness(),
        body: crate::api::BodyLimits {
            bytes: config.max_body_bytes,
            deadline: config.header_read_timeout,
        },
        draining: AtomicBool::new(false),
        watch_slots,
        watch_max_duration: config.watch_max_duration,
        watch_write_timeout: config.client_write_timeout,
        openapi: std::sync::OnceLock::new(),
        ui: crate::api::Ui::new(upstream(&config.ui_gateway, config, &metrics)?),
        acquire_rate: config
            .quota_acquire_rate
            .filter(|_| auth.is_some())
            .map(crate::api::AcquireRate::new),
        auth,
        judge: judge.clone(),
        audit,
    });
    // etcd's gRPC API beside the HTTP routes, on the same listener(s).
    let app = crate::grpc::front(
        etcd_core,
        judge,
        state.etcd.clone(),
        config.max_body_bytes,
        api::router(state.clone(), crate::v3::router(v3)),
    );
    Ok((state, app))
}

/// The replica's event-stream slots, their use a gauge.
fn watch_slots(config: &Config, metrics: &Metrics) -> Arc<crate::api::WatchSlots> {
    let watch_slots = Arc::new(crate::api::WatchSlots::new(
        config.max_watch_streams,
        config.watch_streams_per_principal(),
    ));
    let slots = watch_slots.clone();
    metrics
        .meter()
        .u64_observable_gauge("lease_proxy.watch.streams")
        .with_description("Ownership event streams (GET /v1/watch) open on this replica.")
        .with_callback(move |o| o.observe(slots.open() as u64, &[]))
        .build();
    watch_slots
}

/// etcd's own API, namespaced per tenant: what `/v3` and the gRPC front serve.
fn etcd_api(
    config: &Config,
    base: &Base,
    slots: Arc<crate::api::WatchSlots>,
    tasks: &Tasks,
) -> Arc<crate::etcdapi::Service> {
    Arc::new(crate::etcdapi::Service::new(
        base.etcd.clone(),
        base.keepalive.clone(),
        base.keys.clone(),
        crate::etcdapi::Settings {
            lease_markers: config.v3_lease_markers(),
            era: config.era,
            namespace: config.v3_namespace_or_default(),
            limits: crate::etcdapi::Limits {
                keepalive_ids: config.v3_max_keepalive_ids,
                txn_ops: config.v3_max_txn_ops,
                txn_depth: config.v3_max_txn_depth,
            },
        },
        crate::etcdapi::Streams {
            slots,
            stopping: tasks.stopping.clone(),
            max_duration: config.v3_watch_max_duration,
            budgets: Arc::new(crate::etcdapi::WatchBudgets::new(base.metrics.clone())),
            hubs: Default::default(),
            own_keepalives: crate::lease::WatchSlots::new(
                config.keepalive_own_streams,
                config.own_keepalive_streams_per_principal(),
            ),
        },
    ))
}

/// The lease service and the fleet service on it, their writes through one group commit.
fn services(
    config: &Config,
    base: &Base,
    tasks: &Tasks,
) -> Result<(Leases, crate::fleet::Fleets), StartError> {
    let tracker = &tasks.tracker;
    let parts = fleet_parts(config, base, tasks)?;
    let leases = parts.leases.clone();
    let fleets = crate::fleet::Fleets::start(parts, tracker, tasks.stopping.clone());
    Ok((leases, fleets))
}

/// What the fleet service works with, the lease service among it.
fn fleet_parts(
    config: &Config,
    base: &Base,
    tasks: &Tasks,
) -> Result<crate::fleet::Parts, StartError> {
    let (tracker, background) = (&tasks.tracker, &tasks.background);
    let layout = config.layout();
    let holders = Holders::start(
        &base.etcd,
        layout.holders().to_owned(),
        base.audit.clone(),
        base.metrics.clone(),
        tracker,
        background.clone(),
    );
    let limits = Limits {
        min_ttl: config.min_ttl,
        max_ttl: config.max_ttl,
        max_wait: config.max_wait,
        // Quotas are per principal: without authentication there is none (the config refuses
        // the flags without --auth-tokens).
        quota_held: config.quota_held.filter(|_| base.auth.is_some()),
    };
    // Stopped with the background tasks, after the drain: requests still being served keep
    // their batches.
    let commit = GroupCommit::start(
        &base.etcd,
        Batching {
            max: config.batch_max,
            linger: config.batch_linger,
            in_flight: config.batch_in_flight,
        },
        tracker,
        background.clone(),
    );
    let leases = Leases::new(
        crate::lease::Parts {
            etcd: base.etcd.clone(),
            commit: commit.clone(),
            keepalive: base.keepalive.clone(),
            holders,
            keys: base.keys.clone(),
            layout: layout.clone(),
            idempotency_window: config.idempotency_window,
            era: config.era,
            limits,
            prefence: prefence(config, &base.metrics)?,
            spares: config.lease_spares,
            metrics: base.metrics.clone(),
        },
        tracker.clone(),
        tasks.stopping.clone(),
    );
    Ok(crate::fleet::Parts {
        leases,
        etcd: base.etcd.clone(),
        commit,
        layout,
        entitled: entitlement(base.auth.clone()),
        audit: base.audit.clone(),
        metrics: base.metrics.clone(),
        quota: config.fleets_per_principal(),
    })
}

/// The fleet service's parts on etcd at `config`'s endpoints, built as [`run`] builds them,
/// for tests that carry out a fleet's decisions by hand; the tasks behind them stop when the
/// guard is dropped.
#[cfg(test)]
pub(crate) async fn fleet_parts_for_tests(
    config: &Config,
) -> (crate::fleet::Parts, tokio_util::sync::DropGuard) {
    let tasks = Tasks {
        tracker: TaskTracker::new(),
        background: CancellationToken::new(),
        stopping: CancellationToken::new(),
    };
    let stop = tasks.background.clone().drop_guard();
    let base = connect(config, &tasks).await.expect("the replica connects");
    let parts = fleet_parts(config, &base, &tasks).expect("the services start");
    (parts, stop)
}
