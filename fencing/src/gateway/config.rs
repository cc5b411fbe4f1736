//! fence-gateway's configuration: flags, `FENCE_GATEWAY_*` environment variables and an optional
//! TOML file, in that order of precedence, validated before anything starts.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

use std::sync::Arc;

use crate::layer::PathPattern;
use crate::store::{
    MemoryStore, PostgresStore, SharedGate, SqliteStore, StoreError, StoreLatency, Timed,
};
use crate::{Admission, Gate};

/// fence-gateway's configuration.
#[derive(Debug, Clone, Parser, serde::Serialize, serde::Deserialize)]
#[command(
    name = "fence-gateway",
    version,
    about = "Reverse proxy that refuses stale, forged and misdirected fencing tokens"
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

    /// Fencing key file shared with lease-proxy (`KID SECRET` per line). Required.
    #[arg(long, env = "FENCE_GATEWAY_KEY_FILE")]
    pub key_file: Option<PathBuf>,

    /// Take the resource of a write from the path, e.g. `/inventory/{resource}`; otherwise (and
    /// for paths that do not match) from the `Fencing-Resource` header.
    #[arg(long, env = "FENCE_GATEWAY_RESOURCE_PATH")]
    pub resource_path: Option<String>,

    /// Largest request body forwarded, in bytes.
    #[arg(long, env = "FENCE_GATEWAY_MAX_BODY_BYTES", default_value_t = 8 * 1024 * 1024)]
    pub max_body_bytes: usize,

    /// Deadline for the upstream's answer.
    #[arg(long, env = "FENCE_GATEWAY_UPSTREAM_TIMEOUT", default_value = "30s", value_parser = humantime::parse_duration)]
    #[serde(with = "humantime_serde")]
    pub upstream_timeout: Duration,

    /// PostgreSQL connections (each in-flight write holds one with the shared store).
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

    /// Log format: `text` or `json` (one object per line); filter with `RUST_LOG`.
    #[arg(
        long,
        env = "FENCE_GATEWAY_LOG_FORMAT",
        value_enum,
        default_value = "text"
    )]
    pub log_format: crate::cli::LogFormat,

    /// `--print-config`, `--completions`, `--man`.
    #[command(flatten)]
    #[serde(skip)]
    pub print: crate::cli::PrintAndExit,
}

impl crate::cli::Layered for GatewayConfig {
    fn file(&self) -> Option<&std::path::Path> {
        self.config.as_deref()
    }

    fn keep_command_line_only(&mut self, cli: &Self) {
        self.config = cli.config.clone();
        self.print = cli.print.clone();
    }
}

/// A configuration that cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("invalid configuration: {0}")]
pub struct GatewayConfigError(pub String);

impl GatewayConfig {
    /// Parses flags and environment and layers the TOML file under them (not validated: see
    /// [`GatewayConfig::validate`]).
    pub fn load() -> Result<Self, clap::Error> {
        crate::cli::parse_layered()
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
        shown.upstream = shown.upstream.as_deref().map(crate::cli::redact_url);
        shown.store = crate::cli::redact_url(&shown.store);
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

    /// Checks the settings.
    pub fn validate(&self) -> Result<(), GatewayConfigError> {
        let uri: http::Uri = self
            .upstream()?
            .parse()
            .map_err(|e| GatewayConfigError(format!("--upstream: {e}")))?;
        self.key_file()?;
        if uri.scheme_str() != Some("http") || uri.authority().is_none() {
            return Err(GatewayConfigError(
                "--upstream must be an http://host:port URL".into(),
            ));
        }
        if let Some(p) = &self.resource_path {
            if PathPattern::parse(p).is_none() {
                return Err(GatewayConfigError(
                    "--resource-path must end with a `{resource}` segment".into(),
                ));
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
        if let Some(path) = self.store.strip_prefix("sqlite:") {
            let store = SqliteStore::open(path.as_ref())?;
            return Ok(Arc::new(Gate::new(Timed::new(store, latency))));
        }
        if self.store == "memory" {
            tracing::warn!("--store memory: marks are forgotten on restart (tests only)");
            return Ok(Arc::new(Gate::new(Timed::new(MemoryStore::new(), latency))));
        }
        let store = PostgresStore::connect(&self.store, self.max_connections).await?;
        Ok(Arc::new(SharedGate::new(store).with_latency(latency)))
    }
}
