//! Validating a configuration before anything starts: every refusal a clear message, and the
//! binary exits 64.

use std::time::Duration;

use super::{Config, ConfigError};
use crate::etcd::ETCD_MIN_TTL;

impl Config {
    /// Checks the settings make sense together.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_addresses()?;
        self.validate_tls()?;
        self.validate_bounds()?;
        self.validate_quotas()?;
        if let Some(path) = &self.auth_tokens {
            // Parsed here so a bad file stops the binary with 64 before anything starts; the
            // server loads it again (and from then on on every reload).
            crate::auth::Table::load(path).map_err(ConfigError)?;
        }
        self.validate_v3()
    }

    /// The TTL bounds, and every address and URL: etcd's, the upstream's, the pre-fence's.
    fn validate_addresses(&self) -> Result<(), ConfigError> {
        let fail = |m: String| Err(ConfigError(m));
        if self.min_ttl < ETCD_MIN_TTL {
            return fail(format!(
                "--min-ttl must be at least {ETCD_MIN_TTL} (etcd's minimum)"
            ));
        }
        if self.max_ttl < self.min_ttl {
            return fail("--max-ttl must not be below --min-ttl".into());
        }
        if self.max_ttl > i64::MAX as u64 / 1000 {
            return fail("--max-ttl is too large".into());
        }
        if self.etcd_endpoints.is_empty() || self.etcd_endpoints.iter().any(|e| e.trim().is_empty())
        {
            return fail("--etcd-endpoints needs at least one URL".into());
        }
        if let Some(bad) = self
            .etcd_endpoints
            .iter()
            .find(|e| !(e.starts_with("http://") || e.starts_with("https://")))
        {
            return fail(format!("--etcd-endpoints: `{bad}` is not an http(s) URL"));
        }
        for (flag, url) in [
            ("--upstream", &self.upstream),
            ("--prefence-url", &self.prefence_url),
            ("--ui-gateway", &self.ui_gateway),
        ] {
            if let Some(url) = url {
                let ok = url.parse::<http::Uri>().is_ok_and(|u| {
                    matches!(u.scheme_str(), Some("http" | "https")) && u.authority().is_some()
                });
                if !ok {
                    return fail(format!("{flag}: `{url}` is not an http(s)://host:port URL"));
                }
            }
        }
        if let Some(url) = &self.prefence_database_url {
            if url.parse::<tokio_postgres::Config>().is_err() {
                return fail(
                    "--prefence-database-url: not a PostgreSQL URL or connection string".into(),
                );
            }
        }
        let schema = &self.prefence_database_schema;
        let identifier = schema
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
            && schema
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
            && schema.len() <= 63;
        if !identifier {
            return fail(format!(
                "--prefence-database-schema: `{schema}` is not a lowercase SQL identifier"
            ));
        }
        Ok(())
    }

    /// Prefixes, counts, sizes and durations within their ranges.
    fn validate_bounds(&self) -> Result<(), ConfigError> {
        let fail = |m: String| Err(ConfigError(m));
        if self.etcd_prefix.is_empty() || !self.etcd_prefix.ends_with('/') {
            return fail("--etcd-prefix must be non-empty and end with `/`".into());
        }
        if self.keepalive_streams == 0 || self.keepalive_streams > 64 {
            return fail("--keepalive-streams must be between 1 and 64".into());
        }
        if self.keepalive_own_streams > 65_536 {
            return fail("--keepalive-own-streams must be between 0 and 65536".into());
        }
        if self.worker_threads.is_some_and(|n| n == 0 || n > 1024) {
            return fail("--worker-threads must be between 1 and 1024".into());
        }
        if self.idempotency_window < Duration::from_secs(ETCD_MIN_TTL)
            || self.idempotency_window > Duration::from_secs(3600)
        {
            return fail("--idempotency-window must be between 2s and 1h".into());
        }
        if self.max_client_connections == 0 {
            return fail("--max-client-connections must be at least 1".into());
        }
        if self.max_watch_streams == 0 || self.max_watch_streams > 100_000 {
            return fail("--max-watch-streams must be between 1 and 100000".into());
        }
        if self.watch_max_duration < Duration::from_secs(1)
            || self.watch_max_duration > Duration::from_secs(24 * 3600)
        {
            return fail("--watch-max-duration must be between 1s and 24h".into());
        }
        if self
            .v3_watch_max_duration
            .is_some_and(|d| d < Duration::from_secs(1) || d > Duration::from_secs(24 * 3600))
        {
            return fail("--v3-watch-max-duration must be between 1s and 24h".into());
        }
        for (flag, value) in [
            ("--header-read-timeout", self.header_read_timeout),
            ("--idle-timeout", self.idle_timeout),
            ("--client-write-timeout", self.client_write_timeout),
        ] {
            if value.is_zero() {
                return fail(format!("{flag} must be above zero"));
            }
        }
        if !(1..=crate::etcd::ETCD_MAX_TXN_OPS).contains(&self.batch_max) {
            return fail(format!(
                "--batch-max must be between 1 and {}",
                crate::etcd::ETCD_MAX_TXN_OPS
            ));
        }
        if self.batch_linger > Duration::from_millis(100) {
            return fail("--batch-linger must be at most 100ms".into());
        }
        if !(1..=64).contains(&self.batch_in_flight) {
            return fail("--batch-in-flight must be between 1 and 64".into());
        }
        if self.lease_spares > 100_000 {
            return fail("--lease-spares must be at most 100000".into());
        }
        if self.max_body_bytes < 1024 {
            return fail("--max-body-bytes must be at least 1024".into());
        }
        if self.etcd_timeout < Duration::from_millis(100) {
            return fail("--etcd-timeout must be at least 100ms".into());
        }
        Ok(())
    }

    /// The per-principal quotas: only with authentication, and within their ranges.
    fn validate_quotas(&self) -> Result<(), ConfigError> {
        let fail = |m: String| Err(ConfigError(m));
        if self.auth_tokens.is_none()
            && (self.quota_held.is_some()
                || self.quota_acquire_rate.is_some()
                || self.quota_watch_streams.is_some()
                || self.quota_fleets.is_some())
        {
            return fail(
                "--quota-held, --quota-acquire-rate, --quota-watch-streams and --quota-fleets \
                 are per principal and need --auth-tokens"
                    .into(),
            );
        }
        if self.quota_fleets == Some(0) {
            return fail("--quota-fleets must be at least 1".into());
        }
        if let Some(share) = self.quota_watch_streams {
            if share == 0 || share > self.max_watch_streams {
                return fail(
                    "--quota-watch-streams must be between 1 and --max-watch-streams".into(),
                );
            }
        }
        if self.quota_held == Some(0) {
            return fail("--quota-held must be at least 1".into());
        }
        if let Some(rate) = self.quota_acquire_rate {
            if !(rate.is_finite() && rate > 0.0 && rate <= 1e6) {
                return fail("--quota-acquire-rate must be a number above 0 (at most 1e6)".into());
            }
        }
        Ok(())
    }

    /// The TLS and etcd credential settings go together and their files load (so that a bad
    /// file stops the binary with 64, not the first request).
    fn validate_tls(&self) -> Result<(), ConfigError> {
        let fail = |m: String| Err(ConfigError(m));
        if self.tls_cert.is_some() != self.tls_key.is_some() {
            return fail("--tls-cert and --tls-key go together".into());
        }
        if self.tls_client_ca.is_some() && self.tls_cert.is_none() {
            return fail("--tls-client-ca needs --tls-cert and --tls-key (HTTPS)".into());
        }
        if self.tls_client_certs == runtime::tls::ClientCerts::Required
            && self.tls_client_ca.is_none()
        {
            return fail(
                "--tls-client-certs required needs --tls-client-ca (the CAs that sign them)".into(),
            );
        }
        if let Some(files) = self.server_tls() {
            runtime::tls::ServerTls::load(files).map_err(|e| ConfigError(format!("TLS: {e}")))?;
        }
        let https = |url: &String| url.starts_with("https://");
        let upstream_https = self.upstream.iter().chain(&self.prefence_url).any(https);
        let etcd_https = self.etcd_endpoints.iter().any(https);
        for (flag, files, https) in [
            ("--upstream", self.upstream_tls(), upstream_https),
            ("--etcd", self.etcd_tls(), etcd_https),
        ] {
            files
                .validate(https)
                .map_err(|e| ConfigError(format!("{flag}-ca/-cert/-key: {e}")))?;
        }
        let upstream_files = self.upstream_ca.is_some() || self.upstream_cert.is_some();
        if upstream_files && !upstream_https {
            return fail(
                "--upstream-ca/--upstream-cert are for an https:// --upstream or --prefence-url"
                    .into(),
            );
        }
        if self.etcd_user.is_some() != self.etcd_password_file.is_some() {
            return fail("--etcd-user and --etcd-password-file go together".into());
        }
        self.etcd_credentials()?;
        let tls_files = self.etcd_ca.is_some() || self.etcd_cert.is_some();
        if tls_files && self.etcd_endpoints.iter().any(|e| e.starts_with("http://")) {
            return fail(
                "--etcd-ca/--etcd-cert are for https:// endpoints; some --etcd-endpoints are http://"
                    .into(),
            );
        }
        Ok(())
    }

    /// Reads the key file, if one is given, so that an unusable one stops the binary with 64
    /// and names it (at start; `--print-config` does not need the file).
    pub fn check_key_file(&self) -> Result<(), ConfigError> {
        match &self.key_file {
            Some(path) => fencing::Keyring::load(path)
                .map(drop)
                .map_err(|e| ConfigError(format!("--key-file {}: {e}", path.display()))),
            None => Ok(()),
        }
    }

    /// etcd's user and password, read from `--etcd-password-file`.
    pub fn etcd_credentials(&self) -> Result<Option<(String, String)>, ConfigError> {
        let (Some(user), Some(file)) = (&self.etcd_user, &self.etcd_password_file) else {
            return Ok(None);
        };
        let unreadable = |e: &dyn std::fmt::Display| {
            ConfigError(format!("--etcd-password-file {}: {e}", file.display()))
        };
        let password = runtime::files::read_config_file(file, 64 << 10)
            .map_err(|e| unreadable(&e))
            .and_then(|bytes| String::from_utf8(bytes).map_err(|e| unreadable(&e)))?;
        let password = password.trim();
        if password.is_empty() {
            return Err(ConfigError(format!(
                "--etcd-password-file {} is empty",
                file.display()
            )));
        }
        Ok(Some((user.clone(), password.to_owned())))
    }

    /// The `/v3` namespace is usable and cannot reach the proxy's own keys; the `/v3` limits
    /// are sane.
    fn validate_v3(&self) -> Result<(), ConfigError> {
        let fail = |m: String| Err(ConfigError(m));
        let namespace = self.v3_namespace_or_default();
        let prefix = &self.etcd_prefix;
        let reserved = self.layout().v3_kv();
        if namespace.is_empty() {
            return fail("--v3-namespace must not be empty (it would expose every key)".into());
        }
        // Every key of the proxy's own lies under --etcd-prefix. A namespace that is a prefix of
        // it covers them all; one inside it must stay in the subtree reserved for /v3 data.
        if prefix.starts_with(&namespace) {
            return fail(format!(
                "--v3-namespace `{namespace}` covers --etcd-prefix `{prefix}` and so the \
                 proxy's own keys (holders, lease markers)"
            ));
        }
        if namespace.starts_with(prefix.as_str()) && !namespace.starts_with(&reserved) {
            return fail(format!(
                "--v3-namespace `{namespace}` lies among the proxy's own keys under \
                 `{prefix}`; inside it only `{reserved}…` is for /v3"
            ));
        }
        for (flag, value, max) in [
            ("--v3-max-keepalive-ids", self.v3_max_keepalive_ids, 10_000),
            ("--v3-max-txn-ops", self.v3_max_txn_ops, 100_000),
        ] {
            if value == 0 || value > max {
                return fail(format!("{flag} must be between 1 and {max}"));
            }
        }
        if self.v3_max_txn_depth > 16 {
            return fail("--v3-max-txn-depth must be at most 16".into());
        }
        Ok(())
    }
}
