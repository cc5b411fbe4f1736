//! Configuration: one struct, from flags, `LEASE_PROXY_*` environment variables and an optional
//! TOML file, in that order of precedence, validated before anything starts.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{CommandFactory, Parser};
use serde::{Deserialize, Serialize};

use crate::auth::CertPrincipal;
use crate::etcd::ETCD_MIN_TTL;
use crate::keys::Layout;

mod validate;

pub use runtime::cli::LogFormat;

/// The fleets one principal may have made, when `--quota-fleets` is not given.
pub(crate) const DEFAULT_QUOTA_FLEETS: usize = 64;

/// lease-proxy's configuration.
#[derive(Debug, Clone, Parser, Serialize, Deserialize)]
#[command(
    name = "lease-proxy",
    version,
    about = "HTTP lease service on etcd with fencing tokens"
)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// TOML file with any of these settings (keys as the long flag names with `_`);
    /// flags and environment variables override it.
    #[arg(long, env = "LEASE_PROXY_CONFIG")]
    #[serde(skip)]
    pub config: Option<PathBuf>,

    /// Address to listen on.
    #[arg(long, env = "LEASE_PROXY_LISTEN", default_value = "127.0.0.1:7070")]
    pub listen: SocketAddr,

    /// etcd client URLs, comma-separated.
    #[arg(
        long,
        env = "LEASE_PROXY_ETCD_ENDPOINTS",
        value_delimiter = ',',
        default_value = "http://127.0.0.1:2379"
    )]
    pub etcd_endpoints: Vec<String>,

    /// Key prefix for everything the proxy stores in etcd.
    #[arg(long, env = "LEASE_PROXY_ETCD_PREFIX", default_value = "/lease-proxy/")]
    pub etcd_prefix: String,

    /// Fencing key file (`KID SECRET` per line, shared with fence-gateway; the first line
    /// signs, every line verifies). Reloaded on SIGHUP and when the file changes (replace it by
    /// rename); a file that does not load keeps the previous keys. Without one, a development
    /// key is generated in the data directory.
    #[arg(long, env = "LEASE_PROXY_KEY_FILE")]
    pub key_file: Option<PathBuf>,

    /// Directory for generated files (the development key).
    #[arg(long, env = "LEASE_PROXY_DATA_DIR", default_value = ".lease-proxy")]
    pub data_dir: PathBuf,

    /// Fencing era; bump it after restoring etcd from a snapshot.
    #[arg(long, env = "LEASE_PROXY_ERA", default_value_t = 0)]
    pub era: u64,

    /// Shortest TTL accepted, in seconds (at least 2).
    #[arg(long, env = "LEASE_PROXY_MIN_TTL", default_value_t = ETCD_MIN_TTL)]
    pub min_ttl: u64,

    /// Longest TTL accepted, in seconds.
    #[arg(long, env = "LEASE_PROXY_MAX_TTL", default_value_t = 3600)]
    pub max_ttl: u64,

    /// Longest wait an acquire may ask for (`wait_ms`).
    #[arg(long, env = "LEASE_PROXY_MAX_WAIT", default_value = "60s", value_parser = humantime::parse_duration)]
    #[serde(with = "humantime_serde")]
    pub max_wait: Duration,

    /// Largest request body accepted, in bytes.
    #[arg(long, env = "LEASE_PROXY_MAX_BODY_BYTES", default_value_t = 64 * 1024)]
    pub max_body_bytes: usize,

    /// Deadline for each etcd call.
    #[arg(long, env = "LEASE_PROXY_ETCD_TIMEOUT", default_value = "5s", value_parser = humantime::parse_duration)]
    #[serde(with = "humantime_serde")]
    pub etcd_timeout: Duration,

    /// Spare etcd leases kept for reuse by later acquires instead of being revoked (a refused
    /// acquire's, a released grant's); 0 revokes every one at once.
    #[arg(long, env = "LEASE_PROXY_LEASE_SPARES", default_value_t = 256)]
    pub lease_spares: usize,

    /// Group commit: most ownership transactions (acquires, session releases) sent to etcd as
    /// one proposal of nested transactions; 1 sends each alone. At most 128 (etcd's default
    /// `--max-txn-ops`).
    #[arg(long, env = "LEASE_PROXY_BATCH_MAX", default_value_t = 64)]
    pub batch_max: usize,

    /// Group commit: how long the first transaction of a batch waits for more. 0 sends what has
    /// queued while earlier batches were with etcd, so a lone acquire pays no delay.
    #[arg(long, env = "LEASE_PROXY_BATCH_LINGER", default_value = "0s", value_parser = humantime::parse_duration)]
    #[serde(with = "humantime_serde")]
    pub batch_linger: Duration,

    /// Group commit: batches with etcd at once; while all are out, transactions queue and the
    /// next batch takes them together.
    #[arg(long, env = "LEASE_PROXY_BATCH_IN_FLIGHT", default_value_t = 4)]
    pub batch_in_flight: usize,

    /// How long after a grant a retried acquire with the same `Idempotency-Key` (and holder)
    /// still returns it (at least half of this, at most this, by etcd's clock); later retries
    /// are answered like any other acquire. Keep it short: without `--auth-tokens` the key is
    /// all that binds a retry to the original caller (with it, the principal must match too).
    #[arg(long, env = "LEASE_PROXY_IDEMPOTENCY_WINDOW", default_value = "30s", value_parser = humantime::parse_duration)]
    #[serde(with = "humantime_serde")]
    pub idempotency_window: Duration,

    /// Number of long-lived keepalive streams renewals are spread over.
    #[arg(long, env = "LEASE_PROXY_KEEPALIVE_STREAMS", default_value_t = 2)]
    pub keepalive_streams: usize,

    /// Most etcd keepalive streams of their own at once on this replica, one for each gRPC
    /// `LeaseKeepAlive` stream with several renewals under way (0–65536; with `--auth-tokens` a
    /// quarter of them, at least 1, per principal). A stream past the bound renews over the
    /// shared `--keepalive-streams` instead: the same answers, one hand-off more each.
    #[arg(long, env = "LEASE_PROXY_KEEPALIVE_OWN_STREAMS", default_value_t = 256)]
    pub keepalive_own_streams: usize,

    /// Threads serving requests and etcd's answers (1–1024; default one per CPU). Where the
    /// proxy shares its CPUs with etcd or other busy processes, fewer threads spend less CPU on
    /// waking each other: 1 cost 20–25 % less CPU per acquire and renewal on two shared cores
    /// (docs/BENCHMARKS.md).
    #[arg(long, env = "LEASE_PROXY_WORKER_THREADS")]
    pub worker_threads: Option<usize>,

    /// Most client connections served at once; further connections wait in the listen backlog
    /// until one closes.
    #[arg(
        long,
        env = "LEASE_PROXY_MAX_CLIENT_CONNECTIONS",
        default_value_t = 1024
    )]
    pub max_client_connections: usize,

    /// Most ownership event streams (`GET /v1/watch`) served at once by this replica (all on one
    /// shared etcd watch; one left behind reads its own until caught up); further ones are
    /// answered 503 `too-many-watches`.
    #[arg(long, env = "LEASE_PROXY_MAX_WATCH_STREAMS", default_value_t = 256)]
    pub max_watch_streams: usize,

    /// Most ownership event streams one principal may have open on this replica, so that no
    /// principal takes every slot (needs `--auth-tokens`; default a quarter of
    /// `--max-watch-streams`, at least 1; equal to it: no share); its next one is answered 429
    /// `quota-exceeded`. Without authentication all callers are one principal with every slot.
    #[arg(long, env = "LEASE_PROXY_QUOTA_WATCH_STREAMS")]
    pub quota_watch_streams: Option<usize>,

    /// Most fleets one principal may have made at once, across every replica (needs
    /// `--auth-tokens`; default 64): every fleet is decided by every replica, so a principal that
    /// made fleets without end would take the replicas' time from everyone else's. Its next
    /// `PUT` of a new fleet is answered 429 `quota-exceeded`; ending one makes room. Without
    /// authentication all callers are one principal, with no bound.
    #[arg(long, env = "LEASE_PROXY_QUOTA_FLEETS")]
    pub quota_fleets: Option<usize>,

    /// Longest life of one ownership event stream, ±10 % (clients resume where it ended, with
    /// `Last-Event-ID`): bounds how long a client that stopped reading — paused, or gone without
    /// a trace — holds a stream slot and its etcd watch, and re-authenticates everyone.
    #[arg(long, env = "LEASE_PROXY_WATCH_MAX_DURATION", default_value = "10m", value_parser = humantime::parse_duration)]
    #[serde(with = "humantime_serde")]
    pub watch_max_duration: Duration,

    /// Deadline for a client to send a request's headers, the first one counted from the
    /// connection's start (a silent connection is closed after it), and the whole JSON body of
    /// a `/v1` or `/v3` call (408 or code 3 past it; forwarded bodies: `--forward-timeout`).
    #[arg(long, env = "LEASE_PROXY_HEADER_READ_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    #[serde(with = "humantime_serde")]
    pub header_read_timeout: Duration,

    /// How long a client connection with no request in flight stays open (a waiting acquire is
    /// in flight).
    #[arg(long, env = "LEASE_PROXY_IDLE_TIMEOUT", default_value = "60s", value_parser = humantime::parse_duration)]
    #[serde(with = "humantime_serde")]
    pub idle_timeout: Duration,

    /// How long an answer may wait on a client that takes none of it (a paused or vanished
    /// reader, its socket buffers full) before the connection is closed; any progress restarts
    /// the clock.
    #[arg(long, env = "LEASE_PROXY_CLIENT_WRITE_TIMEOUT", default_value = "30s", value_parser = humantime::parse_duration)]
    #[serde(with = "humantime_serde")]
    pub client_write_timeout: Duration,

    /// After SIGTERM, how long to go on serving with `/readyz` at 503 before the listener closes,
    /// so load balancers stop sending new requests first (Kubernetes: a few seconds).
    #[arg(long, env = "LEASE_PROXY_SHUTDOWN_DELAY", default_value = "0s", value_parser = humantime::parse_duration)]
    #[serde(with = "humantime_serde")]
    pub shutdown_delay: Duration,

    /// How long in-flight requests may take to finish after SIGTERM (and the shutdown delay).
    #[arg(long, env = "LEASE_PROXY_DRAIN_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    #[serde(with = "humantime_serde")]
    pub drain_timeout: Duration,

    /// Base URL holders' writes are forwarded to (`/v1/leases/{resource}/forward/…`), usually a
    /// fence-gateway.
    #[arg(long, env = "LEASE_PROXY_UPSTREAM")]
    pub upstream: Option<String>,

    /// Enforcer to pre-fence at every grant (`POST {url}/fence/{resource}`), so the previous
    /// holder is cut off before the new grant is returned. A failed pre-fence withdraws the grant.
    #[arg(long, env = "LEASE_PROXY_PREFENCE_URL")]
    pub prefence_url: Option<String>,

    /// fence-gateway whose feed (`GET {url}/fence-gateway/feed`: marks and refusals) the
    /// dashboard at `/ui` shows, relayed by the proxy (`/ui/enforcer`) with each caller's
    /// unreadable resources removed; TLS as for `--upstream`.
    #[arg(long, env = "LEASE_PROXY_UI_GATEWAY")]
    pub ui_gateway: Option<String>,

    /// PostgreSQL with fencing's in-database package (`fence-gateway pg install`) to pre-fence
    /// at every grant: `SELECT {schema}.admit(resource, token)` in a transaction of its own,
    /// committed before the grant is returned, under `--forward-timeout`; the same marks SQL
    /// writers and fence-gateway's PostgreSQL store use. A failed pre-fence withdraws the grant.
    /// With `--prefence-url` too, both are raised.
    #[arg(long, env = "LEASE_PROXY_PREFENCE_DATABASE_URL")]
    pub prefence_database_url: Option<String>,

    /// The in-database package's schema in `--prefence-database-url`.
    #[arg(
        long,
        env = "LEASE_PROXY_PREFENCE_DATABASE_SCHEMA",
        default_value = "fencing"
    )]
    pub prefence_database_schema: String,

    /// Deadline for the upstream's answer to a forwarded request or a pre-fence.
    #[arg(long, env = "LEASE_PROXY_FORWARD_TIMEOUT", default_value = "30s", value_parser = humantime::parse_duration)]
    #[serde(with = "humantime_serde")]
    pub forward_timeout: Duration,

    /// Largest forwarded request body, in bytes.
    #[arg(long, env = "LEASE_PROXY_MAX_FORWARD_BYTES", default_value_t = 8 * 1024 * 1024)]
    pub max_forward_bytes: usize,

    /// Key namespace of the etcd-compatible `/v3` KV and lock API (default `{etcd-prefix}v3/kv/`);
    /// `/v3` clients can neither see nor touch keys outside it. Must be non-empty and disjoint
    /// from the proxy's own keys: inside `--etcd-prefix` only under `{etcd-prefix}v3/kv/`, and
    /// never a prefix of `--etcd-prefix`.
    #[arg(long, env = "LEASE_PROXY_V3_NAMESPACE")]
    pub v3_namespace: Option<String>,

    /// Most keepalive requests (JSON objects) in one `/v3/lease/keepalive` body.
    #[arg(long, env = "LEASE_PROXY_V3_MAX_KEEPALIVE_IDS", default_value_t = 64)]
    pub v3_max_keepalive_ids: usize,

    /// Most compares and operations in one `/v3/kv/txn`, counted at every nesting depth.
    #[arg(long, env = "LEASE_PROXY_V3_MAX_TXN_OPS", default_value_t = 256)]
    pub v3_max_txn_ops: usize,

    /// Deepest nesting of transactions inside a `/v3/kv/txn` (0: no nested transactions).
    #[arg(long, env = "LEASE_PROXY_V3_MAX_TXN_DEPTH", default_value_t = 4)]
    pub v3_max_txn_depth: usize,

    /// Longest life of one etcd-API stream that holds an etcd watch (a gRPC `Watch` stream, an
    /// election `Observe`), after which it ends Unavailable ("reconnect and resume"). Unset (the
    /// default) such a stream lasts as long as its client, as etcd's do: not every etcd client
    /// resumes (python-etcd3's watch ends with an error). A reader that takes nothing is ended
    /// by its buffer's bound and `--client-write-timeout`, a vanished one by TCP keepalive, and
    /// every stream is judged again when the token file changes; 1s–24h when set.
    #[arg(long, env = "LEASE_PROXY_V3_WATCH_MAX_DURATION", value_parser = humantime::parse_duration)]
    #[serde(default, with = "humantime_serde")]
    pub v3_watch_max_duration: Option<Duration>,

    /// Bearer-token file turning client authentication on: lines `PRINCIPAL SHA256HEX
    /// PERM[,PERM…]`, `PERM` = `OP:PREFIX` (`acquire`, `read`, `forward`, `v3`; `*` for every
    /// resource), `#` comments, every line ending in a newline. Reloaded on SIGHUP and when the
    /// file changes (replace it by rename); a reload that does not parse, is cut short or names
    /// no principal keeps the previous table. Without it anyone who can connect may call.
    #[arg(long, env = "LEASE_PROXY_AUTH_TOKENS")]
    pub auth_tokens: Option<PathBuf>,

    /// Most grants one principal may hold at once, across every replica (needs
    /// `--auth-tokens`); the next acquire is answered 429 `quota-exceeded`.
    #[arg(long, env = "LEASE_PROXY_QUOTA_HELD")]
    pub quota_held: Option<u64>,

    /// Acquires a second one principal may make through one replica, a token bucket with a
    /// burst of max(1, ⌈R⌉) (needs `--auth-tokens`); more are answered 429 `quota-exceeded`.
    /// Per replica: K replicas let a principal make up to K·R.
    #[arg(long, env = "LEASE_PROXY_QUOTA_ACQUIRE_RATE")]
    pub quota_acquire_rate: Option<f64>,

    /// Serve HTTPS with this certificate chain (PEM, the proxy's own certificate first), with
    /// `--tls-key`. Both are reloaded on SIGHUP and when either file changes; connections open
    /// keep the certificate they started with.
    #[arg(long, env = "LEASE_PROXY_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,

    /// The private key (PEM) of `--tls-cert`.
    #[arg(long, env = "LEASE_PROXY_TLS_KEY")]
    pub tls_key: Option<PathBuf>,

    /// CAs (PEM) that sign client certificates (mTLS; needs `--tls-cert`). A verified
    /// certificate authenticates the principal it names (`--tls-client-principal`) when the
    /// token file has a `PRINCIPAL cert PERMS` line for it.
    #[arg(long, env = "LEASE_PROXY_TLS_CLIENT_CA")]
    pub tls_client_ca: Option<PathBuf>,

    /// With `--tls-client-ca`: whether every client must present a certificate (`required`) or
    /// may (`optional`: clients without one authenticate with a bearer token).
    #[arg(
        long,
        env = "LEASE_PROXY_TLS_CLIENT_CERTS",
        value_enum,
        default_value = "optional"
    )]
    pub tls_client_certs: runtime::tls::ClientCerts,

    /// Which name of a client certificate is its principal: the subject's common name (`cn`),
    /// or the first DNS subject alternative name that has a `cert` line (`dns`).
    #[arg(
        long,
        env = "LEASE_PROXY_TLS_CLIENT_PRINCIPAL",
        value_enum,
        default_value = "cn"
    )]
    pub tls_client_principal: CertPrincipal,

    /// CAs (PEM) of etcd's server certificates, for `https://` endpoints (default: the
    /// system's CAs).
    #[arg(long, env = "LEASE_PROXY_ETCD_CA")]
    pub etcd_ca: Option<PathBuf>,

    /// Client certificate (PEM) presented to etcd (`--client-cert-auth`), with `--etcd-key`.
    #[arg(long, env = "LEASE_PROXY_ETCD_CERT")]
    pub etcd_cert: Option<PathBuf>,

    /// The private key (PEM) of `--etcd-cert`.
    #[arg(long, env = "LEASE_PROXY_ETCD_KEY")]
    pub etcd_key: Option<PathBuf>,

    /// etcd user, when etcd's authentication is enabled; the password is read from
    /// `--etcd-password-file` (never a flag: command lines are visible to every local user).
    #[arg(long, env = "LEASE_PROXY_ETCD_USER")]
    pub etcd_user: Option<String>,

    /// File holding the password of `--etcd-user` (one line; surrounding whitespace ignored).
    #[arg(long, env = "LEASE_PROXY_ETCD_PASSWORD_FILE")]
    pub etcd_password_file: Option<PathBuf>,

    /// CAs (PEM) of the `--upstream` and `--prefence-url` servers, for `https://` URLs
    /// (default: the system's CAs).
    #[arg(long, env = "LEASE_PROXY_UPSTREAM_CA")]
    pub upstream_ca: Option<PathBuf>,

    /// Client certificate (PEM) presented to the upstream and the pre-fence enforcer, with
    /// `--upstream-key` (fence-gateway's `--fence-principals` checks it).
    #[arg(long, env = "LEASE_PROXY_UPSTREAM_CERT")]
    pub upstream_cert: Option<PathBuf>,

    /// The private key (PEM) of `--upstream-cert`.
    #[arg(long, env = "LEASE_PROXY_UPSTREAM_KEY")]
    pub upstream_key: Option<PathBuf>,

    /// Audit log: one JSON line per grant, release, refused renewal and refusal by
    /// authentication or authorisation, appended by a background writer (a full queue drops
    /// events and counts them, `lease_proxy_audit_dropped_total`).
    #[arg(long, env = "LEASE_PROXY_AUDIT_LOG")]
    pub audit_log: Option<PathBuf>,

    /// Log format.
    #[arg(
        long,
        env = "LEASE_PROXY_LOG_FORMAT",
        value_enum,
        default_value = "text"
    )]
    pub log_format: LogFormat,

    /// `--print-config`, `--completions`, `--man`.
    #[command(flatten)]
    #[serde(skip)]
    pub print: runtime::cli::PrintAndExit,
}

impl runtime::cli::Layered for Config {
    fn file(&self) -> Option<&Path> {
        self.config.as_deref()
    }

    fn keep_command_line_only(&mut self, cli: &Self) {
        self.config = cli.config.clone();
        self.print = cli.print.clone();
    }
}

/// A configuration that cannot be used; the binary exits with status 64 (EX_USAGE).
#[derive(Debug, thiserror::Error)]
#[error("invalid configuration: {0}")]
pub struct ConfigError(pub String);

impl Config {
    /// How the server drains after SIGTERM (`--shutdown-delay`, `--drain-timeout`).
    pub(crate) fn drain(&self) -> runtime::serve::Drain {
        runtime::serve::Drain {
            delay: self.shutdown_delay,
            deadline: self.drain_timeout,
        }
    }

    /// The bounds on client connections (`--max-client-connections` and the client timeouts).
    pub(crate) fn connection_limits(&self) -> runtime::serve::Limits {
        runtime::serve::Limits {
            max_connections: self.max_client_connections,
            header_read_timeout: self.header_read_timeout,
            idle_timeout: self.idle_timeout,
            write_timeout: self.client_write_timeout,
        }
    }

    /// Parses flags and environment, layers the TOML file under them, and validates.
    pub fn load() -> Result<Self, clap::Error> {
        let config: Self = runtime::cli::parse_layered()?;
        config
            .validate()
            .map_err(|e| Self::command().error(clap::error::ErrorKind::InvalidValue, e))?;
        Ok(config)
    }

    /// The effective settings as TOML, credentials in URLs redacted (for `--print-config`).
    pub fn redacted_toml(&self) -> Result<String, ConfigError> {
        let mut shown = self.clone();
        let redact = runtime::cli::redact_url;
        shown.etcd_endpoints = shown.etcd_endpoints.iter().map(|e| redact(e)).collect();
        shown.upstream = shown.upstream.as_deref().map(redact);
        shown.prefence_url = shown.prefence_url.as_deref().map(redact);
        shown.ui_gateway = shown.ui_gateway.as_deref().map(redact);
        shown.prefence_database_url = shown.prefence_database_url.as_deref().map(redact);
        toml::to_string(&shown).map_err(|e| ConfigError(e.to_string()))
    }

    /// The HTTPS server's files, when `--tls-cert` is given.
    pub fn server_tls(&self) -> Option<runtime::tls::ServerFiles> {
        Some(runtime::tls::ServerFiles {
            cert: self.tls_cert.clone()?,
            key: self.tls_key.clone()?,
            client_ca: self.tls_client_ca.clone(),
            client_certs: self.tls_client_certs,
        })
    }

    /// TLS towards the upstream and the pre-fence enforcer.
    pub fn upstream_tls(&self) -> runtime::tls::ClientFiles {
        runtime::tls::ClientFiles {
            ca: self.upstream_ca.clone(),
            cert: self.upstream_cert.clone(),
            key: self.upstream_key.clone(),
        }
    }

    /// TLS towards etcd.
    pub fn etcd_tls(&self) -> runtime::tls::ClientFiles {
        runtime::tls::ClientFiles {
            ca: self.etcd_ca.clone(),
            cert: self.etcd_cert.clone(),
            key: self.etcd_key.clone(),
        }
    }

    /// The `/v3` namespace in effect.
    /// The event streams one principal may have open (`--quota-watch-streams` or its default);
    /// `None` without authentication, whose one anonymous principal may use every slot.
    pub(crate) fn watch_streams_per_principal(&self) -> Option<usize> {
        self.auth_tokens.as_ref()?;
        Some(
            self.quota_watch_streams
                .unwrap_or((self.max_watch_streams / 4).max(1)),
        )
    }

    /// The etcd keepalive streams of their own one principal's gRPC keepalive streams may have
    /// (a quarter of `--keepalive-own-streams`, at least 1); `None` without authentication.
    pub(crate) fn own_keepalive_streams_per_principal(&self) -> Option<usize> {
        self.auth_tokens.as_ref()?;
        Some((self.keepalive_own_streams / 4).max(1))
    }

    /// The fleets one principal may have made (`--quota-fleets` or its default); `None`
    /// without authentication.
    pub(crate) fn fleets_per_principal(&self) -> Option<usize> {
        self.auth_tokens.as_ref()?;
        Some(self.quota_fleets.unwrap_or(DEFAULT_QUOTA_FLEETS))
    }

    pub(crate) fn v3_namespace_or_default(&self) -> String {
        self.v3_namespace
            .clone()
            .unwrap_or_else(|| self.layout().v3_kv())
    }

    /// Where the markers of `/v3` leases live (outside every valid `/v3` namespace).
    pub(crate) fn v3_lease_markers(&self) -> String {
        self.layout().v3_leases()
    }

    /// The etcd key layout under `--etcd-prefix`.
    pub(crate) fn layout(&self) -> Layout {
        Layout::new(&self.etcd_prefix)
    }

    /// The defaults, with the given etcd endpoints — for tests and embedding.
    pub fn with_endpoints(endpoints: Vec<String>) -> Self {
        let mut config = Self::parse_from(["lease-proxy"]);
        config.etcd_endpoints = endpoints;
        config
    }
}

#[cfg(test)]
mod tests;
