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
    Metrics(#[source] fencing::Error),
    /// A TLS certificate, key or CA file is unusable.
    #[error("TLS: {0}")]
    Tls(#[source] fencing::Error),
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

/// Serves the proxy on `listener` until `shutdown` resolves, then drains and returns.
pub async fn run(
    listener: TcpListener,
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), StartError> {
    let keys = load_keys(&config)?;
    let tracker = TaskTracker::new();
    let background = CancellationToken::new();
    // However `run` returns (a failed start included), the background tasks are told to stop.
    let _stop_background = background.clone().drop_guard();
    // Watched from the start, so SIGHUP (whose default action ends the process) is handled
    // from here on, while etcd is still being dialled too.
    keys.watch(&tracker, background.clone());
    let auth = match &config.auth_tokens {
        Some(path) => Some(Arc::new(
            Auth::load(path, config.tls_client_principal).map_err(StartError::Auth)?,
        )),
        None => None,
    };
    let tls = config
        .server_tls()
        .map(|files| fencing::tls::ServerTls::load(files).map(Arc::new))
        .transpose()
        .map_err(StartError::Tls)?;
    let metrics = Arc::new(Metrics::new().map_err(StartError::Metrics)?);
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
        &tracker,
        background.clone(),
    )
    .await?;
    let stopping = CancellationToken::new();
    if let Some(tls) = &tls {
        tls.watch(&tracker, background.clone());
    }

    let keepalive = KeepAlive::start(
        &etcd,
        config.keepalive_streams,
        &tracker,
        background.clone(),
    );
    if let Some(auth) = &auth {
        auth.watch(&tracker, background.clone());
    }
    // The writer outlives the drain (cancelled with the other background tasks), so the
    // events of requests finishing during it are written.
    let audit = match &config.audit_log {
        Some(path) => Audit::start(path, metrics.clone(), &tracker, background.clone())
            .await
            .map_err(|source| StartError::AuditLog {
                path: path.clone(),
                source,
            })?,
        None => Audit::off(metrics.clone()),
    };
    let watch_slots = Arc::new(crate::api::WatchSlots::new(
        config.max_watch_streams,
        config.watch_streams_per_principal(),
    ));
    let etcd_core = Arc::new(crate::etcdapi::Service::new(
        etcd.clone(),
        keepalive.clone(),
        keys.clone(),
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
            slots: watch_slots.clone(),
            stopping: stopping.clone(),
            max_duration: config.v3_watch_max_duration,
            budgets: Arc::new(crate::etcdapi::WatchBudgets::new(metrics.clone())),
            hubs: Default::default(),
        },
    ));
    let judge = crate::auth::Judge::new(auth.clone(), metrics.clone(), audit.clone());
    let v3 = Arc::new(crate::v3::V3::new(
        etcd_core.clone(),
        judge.clone(),
        etcd.clone(),
        crate::v3::Settings {
            max_body: config.max_body_bytes,
            body_deadline: config.header_read_timeout,
        },
    ));
    let layout = config.layout();
    let holders = Holders::start(
        &etcd,
        layout.holders().to_owned(),
        audit.clone(),
        metrics.clone(),
        &tracker,
        background.clone(),
    );
    let limits = Limits {
        min_ttl: config.min_ttl,
        max_ttl: config.max_ttl,
        max_wait: config.max_wait,
        // Quotas are per principal: without authentication there is none (the config refuses
        // the flags without --auth-tokens).
        quota_held: config.quota_held.filter(|_| auth.is_some()),
    };
    // Stopped with the background tasks, after the drain: requests still being served keep
    // their batches.
    let commit = GroupCommit::start(
        &etcd,
        Batching {
            max: config.batch_max,
            linger: config.batch_linger,
            in_flight: config.batch_in_flight,
        },
        &tracker,
        background.clone(),
    );
    let commit_for_fleets = commit.clone();
    let leases = Leases::new(
        crate::lease::Parts {
            etcd: etcd.clone(),
            commit,
            keepalive,
            holders,
            keys,
            layout: layout.clone(),
            idempotency_window: config.idempotency_window,
            era: config.era,
            limits,
            prefence: prefence(&config, &metrics)?,
            spares: config.lease_spares,
            metrics: metrics.clone(),
        },
        tracker.clone(),
        stopping.clone(),
    );
    let fleets = crate::fleet::Fleets::start(
        crate::fleet::Parts {
            leases: leases.clone(),
            etcd: etcd.clone(),
            commit: commit_for_fleets,
            layout: layout.clone(),
            entitled: entitlement(auth.clone()),
            audit: audit.clone(),
            metrics: metrics.clone(),
            quota: config.fleets_per_principal(),
        },
        &tracker,
        stopping.clone(),
    );
    let slots = watch_slots.clone();
    metrics
        .meter()
        .u64_observable_gauge("lease_proxy.watch.streams")
        .with_description("Ownership event streams (GET /v1/watch) open on this replica.")
        .with_callback(move |o| o.observe(slots.open() as u64, &[]))
        .build();
    let state = Arc::new(AppState {
        upstream: upstream(&config.upstream, &config, &metrics)?,
        max_forward_bytes: config.max_forward_bytes,
        leases,
        fleets,
        etcd,
        readiness_key: layout.readiness(),
        body: crate::api::BodyLimits {
            bytes: config.max_body_bytes,
            deadline: config.header_read_timeout,
        },
        draining: AtomicBool::new(false),
        watch_slots,
        watch_max_duration: config.watch_max_duration,
        watch_write_timeout: config.client_write_timeout,
        openapi: std::sync::OnceLock::new(),
        ui: crate::api::Ui::new(upstream(&config.ui_gateway, &config, &metrics)?),
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

    tracing::info!(listen = %listener.local_addr()?, https = tls.is_some(), endpoints = ?config.etcd_endpoints, "lease-proxy serving");
    let result = fencing::serve::until_shutdown(
        fencing::serve::Listener { tcp: listener, tls },
        app,
        shutdown,
        &state.draining,
        stopping.clone(),
        fencing::serve::Drain {
            delay: config.shutdown_delay,
            deadline: config.drain_timeout,
        },
        fencing::serve::Limits {
            max_connections: config.max_client_connections,
            header_read_timeout: config.header_read_timeout,
            idle_timeout: config.idle_timeout,
            write_timeout: config.client_write_timeout,
        },
    )
    .await;
    stopping.cancel();
    state.leases.revoke_spares().await;
    background.cancel();
    tracker.close();
    tracker.wait().await;
    tracing::info!("stopped");
    result.map_err(StartError::Serve)
}
