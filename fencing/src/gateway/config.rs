//! fence-gateway's configuration: flags, `FENCE_GATEWAY_*` environment variables and an optional
//! TOML file, in that order of precedence, validated before anything starts.
//!

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

use std::sync::Arc;

use crate::layer::PathPattern;
use crate::store::{
    HighWaterMarks, MemoryStore, PostgresStore, SharedGate, SqliteStore, StoreError, StoreLatency,
    Timed,
};
use crate::{Admission, Gate};

/// fence-gateway's configuration.
#[derive(Debug, Clone, Parser, serde::Serialize, serde::Deserialize)]
#[command(
    name = "fence-gateway",
    version,
    about = "Reverse proxy that refuses stale, forged and misdirected fencing tokens",
    after_help = "The fencing key file: fence-gateway keys generate FILE makes one; keys add, \
                  keys promote and keys remove rotate its keys (fence-gateway keys help)."
)]
#[serde(deny_unknown_fields)]
pub struct GatewayConfig {
    /// TOML file with any of these settings (keys as the long flag names with `_`);
    /// flags and environment variables override it.
    #[arg(long, env = "FENCE_GATEWAY_CONFIG")]
    #[serde(skip)]
    pub config: Option<PathBuf>,

    /// Address to listen on.
    #[arg(long, env = "FENCE_GATEWAY_LISTEN", default_value = "127.0.0.1:7071")]
    pub listen: SocketAddr,

    /// Base URL of the protected storage service (http). Required.
    #[arg(long, env = "FENCE_GATEWAY_UPSTREAM")]
    pub upstream: Option<String>,

    /// Where high-water marks live: `sqlite:PATH` (durable default, one gateway),
    /// `postgres://user:pass@host/db` (shared by several gateways) or `memory` (tests only).
    #[arg(
        long,
        env = "FENCE_GATEWAY_STORE",
        default_value = "sqlite:fence-marks.db"
    )]
    pub store: String,

    /// SQLite store only: refuse every token of an era below ERA, on every resource (kept in the
    /// marks file: it stays when the flag is gone, and never goes down). The way forward when the
    /// marks file was lost or restored from a backup, which the gateway otherwise refuses to
    /// start on: bump every lease-proxy's `--era` to ERA, then start with `--era-floor ERA`, ERA
    /// above every era the store used (the refusal names it).
    #[arg(
        long,
        env = "FENCE_GATEWAY_ERA_FLOOR",
        default_value_t = 0,
        value_name = "ERA"
    )]
    pub era_floor: u64,

    /// Fencing key file shared with lease-proxy (`KID SECRET` per line; every line verifies).
    /// Required. Reloaded on SIGHUP and when the file changes (replace it by rename); a file
    /// that does not load keeps the previous keys.
    #[arg(long, env = "FENCE_GATEWAY_KEY_FILE")]
    pub key_file: Option<PathBuf>,

    /// Path mode: take the resource of a write from the path, e.g. `/inventory/{resource}`. Only
    /// canonical paths are admitted (no dot-segments, empty segments, encoded separators, or
    /// encodings in the prefix or resource); a write whose path does not match is refused, never
    /// classified by header. Without it (header mode) the resource is the one `Fencing-Resource`
    /// header, which the storage must check against what it writes.
    #[arg(long, env = "FENCE_GATEWAY_RESOURCE_PATH")]
    pub resource_path: Option<String>,

    /// Largest request body forwarded, in bytes.
    #[arg(long, env = "FENCE_GATEWAY_MAX_BODY_BYTES", default_value_t = 8 * 1024 * 1024)]
    pub max_body_bytes: usize,

    /// Deadline for the upstream's answer.
    #[arg(long, env = "FENCE_GATEWAY_UPSTREAM_TIMEOUT", default_value = "30s", value_parser = humantime::parse_duration)]
    #[serde(with = "humantime_serde")]
    pub upstream_timeout: Duration,

    /// How long a write whose exchange with the upstream ended without a complete answer
    /// (timeout, reset, early answer, client gone) keeps its resource closed to higher tokens,
    /// and how long after start a resource written before counts as possibly in flight. The
    /// storage must finish or abandon any write within this time.
    #[arg(long, env = "FENCE_GATEWAY_WRITE_GRACE", default_value = "10s", value_parser = humantime::parse_duration)]
    #[serde(with = "humantime_serde")]
    pub write_grace: Duration,

    /// Deadline for each call to the mark store (PostgreSQL: pool wait, lock wait and every
    /// statement); past it the write is refused with 503 and nothing changes.
    #[arg(long, env = "FENCE_GATEWAY_STORE_TIMEOUT", default_value = "5s", value_parser = humantime::parse_duration)]
    #[serde(with = "humantime_serde")]
    pub store_timeout: Duration,

    /// How long a resource with nothing in flight stays in the gateway's memory (its mark stays
    /// in the store).
    #[arg(long, env = "FENCE_GATEWAY_IDLE_EVICTION", default_value = "5m", value_parser = humantime::parse_duration)]
    #[serde(with = "humantime_serde")]
    pub idle_eviction: Duration,

    /// Most client connections served at once; further connections wait in the listen backlog.
    #[arg(
        long,
        env = "FENCE_GATEWAY_MAX_CLIENT_CONNECTIONS",
        default_value_t = 1024
    )]
    pub max_client_connections: usize,

    /// Deadline for a client to send a request's headers, the first one counted from the
    /// connection's start (a silent connection is closed after it).
    #[arg(long, env = "FENCE_GATEWAY_HEADER_READ_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    #[serde(with = "humantime_serde")]
    pub header_read_timeout: Duration,

    /// How long a client connection with no request in flight stays open.
    #[arg(long, env = "FENCE_GATEWAY_IDLE_TIMEOUT", default_value = "60s", value_parser = humantime::parse_duration)]
    #[serde(with = "humantime_serde")]
    pub idle_timeout: Duration,

    /// How long an answer may wait on a client that takes none of it (a paused or vanished
    /// reader, its socket buffers full) before the connection is closed; any progress restarts
    /// the clock.
    #[arg(long, env = "FENCE_GATEWAY_CLIENT_WRITE_TIMEOUT", default_value = "30s", value_parser = humantime::parse_duration)]
    #[serde(with = "humantime_serde")]
    pub client_write_timeout: Duration,

    /// PostgreSQL connections in the pool (held only for short statements), plus one listening
    /// connection per gateway for wake-ups.
    #[arg(long, env = "FENCE_GATEWAY_MAX_CONNECTIONS", default_value_t = 16)]
    pub max_connections: usize,

    /// After SIGTERM, how long to go on serving with `/readyz` at 503 before the listener closes,
    /// so load balancers stop sending new requests first (Kubernetes: a few seconds).
    #[arg(long, env = "FENCE_GATEWAY_SHUTDOWN_DELAY", default_value = "0s", value_parser = humantime::parse_duration)]
    #[serde(with = "humantime_serde")]
    pub shutdown_delay: Duration,

    /// How long in-flight requests may take to finish after SIGTERM (and the shutdown delay).
    #[arg(long, env = "FENCE_GATEWAY_DRAIN_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    #[serde(with = "humantime_serde")]
    pub drain_timeout: Duration,

    /// Serve HTTPS with this certificate chain (PEM, the gateway's own certificate first), with
    /// `--tls-key`. Both are reloaded on SIGHUP and when either file changes.
    #[arg(long, env = "FENCE_GATEWAY_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,

    /// The private key (PEM) of `--tls-cert`.
    #[arg(long, env = "FENCE_GATEWAY_TLS_KEY")]
    pub tls_key: Option<PathBuf>,

    /// CAs (PEM) that sign client certificates (mTLS; needs `--tls-cert`).
    #[arg(long, env = "FENCE_GATEWAY_TLS_CLIENT_CA")]
    pub tls_client_ca: Option<PathBuf>,

    /// With `--tls-client-ca`: whether every client must present a certificate (`required`) or
    /// may (`optional`).
    #[arg(
        long,
        env = "FENCE_GATEWAY_TLS_CLIENT_CERTS",
        value_enum,
        default_value = "optional"
    )]
    pub tls_client_certs: runtime::tls::ClientCerts,

    /// Principals allowed to pre-fence (`POST /fence/…`), comma-separated: a verified client
    /// certificate must name one (its subject common name or a DNS subject alternative name;
    /// needs `--tls-client-ca`). Without it anyone who can connect may raise a mark with a
    /// genuine token.
    #[arg(long, env = "FENCE_GATEWAY_FENCE_PRINCIPALS", value_delimiter = ',')]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fence_principals: Vec<String>,

    /// CAs (PEM) of the upstream's certificate, for an `https://` `--upstream` (default: the
    /// system's CAs).
    #[arg(long, env = "FENCE_GATEWAY_UPSTREAM_CA")]
    pub upstream_ca: Option<PathBuf>,

    /// Client certificate (PEM) presented to the upstream, with `--upstream-key`.
    #[arg(long, env = "FENCE_GATEWAY_UPSTREAM_CERT")]
    pub upstream_cert: Option<PathBuf>,

    /// The private key (PEM) of `--upstream-cert`.
    #[arg(long, env = "FENCE_GATEWAY_UPSTREAM_KEY")]
    pub upstream_key: Option<PathBuf>,

    /// A fixed defect put back so the fault campaign can show its checker catches it (a
    /// negative control): no flag, file key or variable sets it; only `fence-gateway-control`,
    /// built with the `negative-controls` feature, does.
    #[cfg(feature = "negative-controls")]
    #[arg(skip)]
    #[serde(skip)]
    pub negative_control: Option<NegativeControl>,

    /// Log format: `text` or `json` (one object per line); filter with `RUST_LOG`.
    #[arg(
        long,
        env = "FENCE_GATEWAY_LOG_FORMAT",
        value_enum,
        default_value = "text"
    )]
    pub log_format: runtime::cli::LogFormat,

    /// `--print-config`, `--completions`, `--man`.
    #[command(flatten)]
    #[serde(skip)]
    pub print: runtime::cli::PrintAndExit,

    /// A subcommand instead of serving (`pg …`); none to serve.
    #[command(subcommand)]
    #[serde(skip)]
    pub command: Option<crate::indb::GatewayCommand>,
}

impl runtime::cli::Layered for GatewayConfig {
    fn file(&self) -> Option<&std::path::Path> {
        self.config.as_deref()
    }

    fn keep_command_line_only(&mut self, cli: &Self) {
        self.config = cli.config.clone();
        self.print = cli.print.clone();
        self.command = cli.command.clone();
    }
}

/// A deliberately broken enforcer, for the fault campaign's negative controls only.
#[cfg(feature = "negative-controls")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum NegativeControl {
    /// A write's permit ends, as complete, with the caller's request: when the answer's headers
    /// reach the caller, or the caller goes away while the storage is still working.
    ReleaseWithCaller,
    /// On PostgreSQL, writes in flight are known only to the gateway that admitted them (the
    /// marks are shared, in-flight writes are not): another gateway raises over them, as when
    /// a dead session's lock vanished.
    LocalGate,
    /// A write's exchange deadline counts from when the gateway reads its admission, not from
    /// before its registration in a shared store, and an admission's answer that a pause made
    /// late is taken (as when it wins the race with the step's timer): a gateway paused
    /// between the two delivers the write after its registration may have lapsed.
    DeadlineFromAdmission,
}

/// A configuration that cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("invalid configuration: {0}")]
pub struct GatewayConfigError(pub String);

impl GatewayConfig {
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

    /// Parses flags and environment and layers the TOML file under them (not validated: see
    /// [`GatewayConfig::validate`]).
    pub fn load() -> Result<Self, clap::Error> {
        runtime::cli::parse_layered()
    }

    /// [`GatewayConfig::load`] from `args` (the program's name first).
    pub fn load_from(
        args: impl IntoIterator<Item = std::ffi::OsString>,
    ) -> Result<Self, clap::Error> {
        runtime::cli::parse_layered_from(args)
    }

    /// The defaults, with the upstream, the store and the key file.
    pub fn new(upstream: impl Into<String>, store: impl Into<String>, key_file: PathBuf) -> Self {
        let mut config = Self::parse_from(["fence-gateway"]);
        config.upstream = Some(upstream.into());
        config.store = store.into();
        config.key_file = Some(key_file);
        config
    }

    /// The effective settings as TOML, credentials in URLs redacted (for `--print-config`).
    pub fn redacted_toml(&self) -> Result<String, GatewayConfigError> {
        let mut shown = self.clone();
        shown.upstream = shown.upstream.as_deref().map(runtime::cli::redact_url);
        shown.store = runtime::cli::redact_url(&shown.store);
        toml::to_string(&shown).map_err(|e| GatewayConfigError(e.to_string()))
    }

    /// The upstream's base URL.
    pub fn upstream(&self) -> Result<&str, GatewayConfigError> {
        self.upstream.as_deref().ok_or_else(|| {
            GatewayConfigError(
                "--upstream is required (flag, FENCE_GATEWAY_UPSTREAM or `upstream` in the \
                 config file)"
                    .into(),
            )
        })
    }

    /// The fencing key file.
    pub fn key_file(&self) -> Result<&std::path::Path, GatewayConfigError> {
        self.key_file.as_deref().ok_or_else(|| {
            GatewayConfigError(
                "--key-file is required (flag, FENCE_GATEWAY_KEY_FILE or `key_file` in the \
                 config file)"
                    .into(),
            )
        })
    }

    /// Reads the key file, so that an unusable one stops the binary with 64 and names it (at
    /// start; `--print-config` does not need the file).
    pub fn check_key_file(&self) -> Result<(), GatewayConfigError> {
        let key_file = self.key_file()?;
        crate::Keyring::load(key_file)
            .map(drop)
            .map_err(|e| GatewayConfigError(format!("--key-file {}: {e}", key_file.display())))
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

    /// TLS towards the upstream.
    pub fn upstream_tls(&self) -> runtime::tls::ClientFiles {
        runtime::tls::ClientFiles {
            ca: self.upstream_ca.clone(),
            cert: self.upstream_cert.clone(),
            key: self.upstream_key.clone(),
        }
    }

    /// The TLS settings go together and their files load.
    fn validate_tls(&self) -> Result<(), GatewayConfigError> {
        let fail = |m: &str| Err(GatewayConfigError(m.into()));
        if self.tls_cert.is_some() != self.tls_key.is_some() {
            return fail("--tls-cert and --tls-key go together");
        }
        if self.tls_client_ca.is_some() && self.tls_cert.is_none() {
            return fail("--tls-client-ca needs --tls-cert and --tls-key (HTTPS)");
        }
        if self.tls_client_certs == runtime::tls::ClientCerts::Required
            && self.tls_client_ca.is_none()
        {
            return fail(
                "--tls-client-certs required needs --tls-client-ca (the CAs that sign them)",
            );
        }
        if !self.fence_principals.is_empty() && self.tls_client_ca.is_none() {
            return fail("--fence-principals needs --tls-client-ca (principals come from client certificates)");
        }
        if self.fence_principals.iter().any(|p| p.trim().is_empty()) {
            return fail("--fence-principals: empty name");
        }
        if let Some(files) = self.server_tls() {
            runtime::tls::ServerTls::load(files)
                .map_err(|e| GatewayConfigError(format!("TLS: {e}")))?;
        }
        let https = self
            .upstream
            .as_deref()
            .is_some_and(|u| u.starts_with("https://"));
        if !https && (self.upstream_ca.is_some() || self.upstream_cert.is_some()) {
            return fail("--upstream-ca/--upstream-cert are for an https:// --upstream");
        }
        self.upstream_tls()
            .validate(https)
            .map_err(|e| GatewayConfigError(format!("--upstream-ca/-cert/-key: {e}")))
    }

    /// Checks the settings.
    pub fn validate(&self) -> Result<(), GatewayConfigError> {
        let uri: http::Uri = self
            .upstream()?
            .parse()
            .map_err(|e| GatewayConfigError(format!("--upstream: {e}")))?;
        self.key_file()?;
        if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.authority().is_none() {
            return Err(GatewayConfigError(
                "--upstream must be an http(s)://host:port URL".into(),
            ));
        }
        self.validate_tls()?;
        if let Some(p) = &self.resource_path {
            if PathPattern::parse(p).is_none() {
                return Err(GatewayConfigError(
                    "--resource-path must be plain literal segments (no empty, `.`, `..`, `%`, \
                     `\\` or braces) ending with a `{resource}` segment"
                        .into(),
                ));
            }
        }
        if self.max_client_connections == 0 {
            return Err(GatewayConfigError(
                "--max-client-connections must be at least 1".into(),
            ));
        }
        for (flag, value) in [
            ("--upstream-timeout", self.upstream_timeout),
            ("--store-timeout", self.store_timeout),
            ("--header-read-timeout", self.header_read_timeout),
            ("--idle-timeout", self.idle_timeout),
            ("--client-write-timeout", self.client_write_timeout),
            ("--idle-eviction", self.idle_eviction),
        ] {
            if value.is_zero() {
                return Err(GatewayConfigError(format!("{flag} must be above zero")));
            }
        }
        let postgres =
            self.store.starts_with("postgres://") || self.store.starts_with("postgresql://");
        if self.store != "memory" && !self.store.starts_with("sqlite:") && !postgres {
            return Err(GatewayConfigError(format!(
                "--store `{}`: use sqlite:PATH, postgres://… or memory",
                self.store
            )));
        }
        if self.era_floor > 0 && !self.store.starts_with("sqlite:") {
            return Err(GatewayConfigError(
                "--era-floor is for the SQLite store (--store sqlite:PATH)".into(),
            ));
        }
        if postgres && self.store.parse::<tokio_postgres::Config>().is_err() {
            return Err(GatewayConfigError("--store: invalid PostgreSQL URL".into()));
        }
        Ok(())
    }

    /// Opens the configured store behind its gate: the in-process gate for SQLite and memory,
    /// the database-wide gate for PostgreSQL (several gateways may share it). Store calls are
    /// timed into `latency`.
    pub async fn open_admission(
        &self,
        latency: StoreLatency,
    ) -> Result<Arc<dyn Admission>, StoreError> {
        let local = |store: Box<dyn HighWaterMarks>| -> Arc<dyn Admission> {
            Arc::new(
                Gate::new(Timed::new(store, latency.clone()))
                    .with_write_grace(self.write_grace)
                    .with_idle_eviction(self.idle_eviction)
                    .with_store_timeout(self.store_timeout),
            )
        };
        if let Some(path) = self.store.strip_prefix("sqlite:") {
            let store = SqliteStore::open_with_era_floor(path.as_ref(), self.era_floor)?;
            return Ok(local(Box::new(store)));
        }
        if self.store == "memory" {
            tracing::warn!("--store memory: marks are forgotten on restart (tests only)");
            return Ok(local(Box::new(MemoryStore::new())));
        }
        #[cfg(feature = "negative-controls")]
        if self.negative_control == Some(NegativeControl::LocalGate) {
            tracing::warn!("negative control local-gate: in-flight writes are not shared");
            let store = PostgresStore::connect_with_deadline(
                &self.store,
                self.max_connections,
                self.store_timeout,
            )
            .await?;
            return Ok(local(Box::new(store)));
        }
        // The key file names this deployment's sets of marks (never a second one of them).
        let keys = self
            .key_file()
            .map_err(|e| StoreError(e.to_string()))
            .and_then(|path| {
                crate::Keyring::load(path)
                    .map_err(|e| StoreError(format!("--key-file {}: {e}", path.display())))
            })?;
        let store = PostgresStore::connect_for(
            &self.store,
            self.max_connections,
            self.store_timeout,
            &keys,
        )
        .await?
        .with_max_exchange(self.upstream_timeout)
        .with_write_grace(self.write_grace);
        let gate = SharedGate::new(store).with_latency(latency);
        #[cfg(feature = "negative-controls")]
        let gate = if self.negative_control == Some(NegativeControl::DeadlineFromAdmission) {
            gate.negative_control_late_answers()
        } else {
            gate
        };
        Ok(Arc::new(gate))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lease_proxy_testkit::pki::Pki;

    #[test]
    fn tls_settings_go_together_and_their_files_load() {
        let pki = Pki::new("gateway-config");
        let server = pki.server("gateway");
        let key = pki.ca().with_file_name("fencing.key");
        crate::Keyring::create_file(&key, &crate::KeyId::parse("k1").unwrap()).unwrap();
        let base = || GatewayConfig::new("http://127.0.0.1:1", "memory", key.clone());
        let refused = |config: GatewayConfig| config.validate().unwrap_err().to_string();

        let mut ok = base();
        ok.tls_cert = Some(server.cert.clone());
        ok.tls_key = Some(server.key.clone());
        ok.tls_client_ca = Some(pki.ca().to_owned());
        ok.fence_principals = vec!["lease-proxy".into()];
        ok.validate().unwrap();

        let mut c = base();
        c.tls_cert = Some(server.cert.clone());
        assert!(refused(c).contains("go together"));
        let mut c = ok.clone();
        c.tls_client_ca = None;
        c.fence_principals.clear();
        c.tls_client_certs = runtime::tls::ClientCerts::Required;
        assert!(refused(c).contains("needs --tls-client-ca"));
        base().check_key_file().unwrap();
        let mut c = base();
        c.key_file = Some(key.with_file_name("no-key"));
        let err = c.check_key_file().unwrap_err().to_string();
        assert!(err.contains("--key-file"), "{err}");
        let mut c = base();
        c.fence_principals = vec!["lease-proxy".into()];
        assert!(refused(c).contains("--fence-principals needs --tls-client-ca"));
        let mut c = ok.clone();
        c.fence_principals = vec![" ".into()];
        assert!(refused(c).contains("empty name"));
        let mut c = ok.clone();
        c.tls_key = Some(pki.server("other").key);
        assert!(refused(c).contains("TLS"));
        let mut c = base();
        c.upstream = Some("https://127.0.0.1:1".into());
        c.upstream_cert = Some(server.cert.clone());
        assert!(refused(c).contains("needs its key"));
        let mut c = base();
        c.upstream_ca = Some(pki.ca().to_owned());
        assert!(refused(c).contains("https://"));
        let mut c = base();
        c.upstream = Some("ftp://127.0.0.1:1".into());
        assert!(refused(c).contains("http(s)"));
        let mut c = base();
        c.era_floor = 1;
        assert!(refused(c).contains("--era-floor is for the SQLite store"));
        let mut c = GatewayConfig::new("http://127.0.0.1:1", "sqlite:m.db", key.clone());
        c.era_floor = 1;
        c.validate().unwrap();
    }
}
