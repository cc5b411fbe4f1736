//! The configuration's parsing, layering and validation.

use super::*;

#[test]
fn defaults_are_valid() {
    let c = Config::parse_from(["lease-proxy"]);
    c.validate().unwrap();
    assert_eq!(c.listen.to_string(), "127.0.0.1:7070");
    assert_eq!(c.etcd_prefix, "/lease-proxy/");
}

#[test]
fn endpoints_split_on_commas() {
    let c = Config::parse_from(["lease-proxy", "--etcd-endpoints", "http://a:1,http://b:2"]);
    assert_eq!(c.etcd_endpoints, vec!["http://a:1", "http://b:2"]);
}

#[test]
fn file_layers_under_flags() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.toml");
    std::fs::write(&path, "max_ttl = 120\nera = 7\nmax_wait = \"5s\"\n").unwrap();
    let c = Config::parse_from(["lease-proxy", "--era", "9"]);
    let layered = runtime::cli::layer_file(&c, &path, |id| id != "era").unwrap();
    assert_eq!(layered.max_ttl, 120);
    assert_eq!(layered.era, 9, "a flag beats the file");
    assert_eq!(layered.max_wait, Duration::from_secs(5));
    std::fs::write(&path, "no_such_setting = 1\n").unwrap();
    assert!(runtime::cli::layer_file(&c, &path, |_| true).is_err());
    std::fs::write(&path, "print_config = true\n").unwrap();
    assert!(runtime::cli::layer_file(&c, &path, |_| true).is_err());
}

#[test]
fn bad_values_are_refused() {
    let mut c = Config::parse_from(["lease-proxy"]);
    c.min_ttl = 1;
    assert!(c.validate().is_err());
    let mut c = Config::parse_from(["lease-proxy"]);
    c.etcd_prefix = "/x".into();
    assert!(c.validate().is_err());
    let mut c = Config::parse_from(["lease-proxy"]);
    c.etcd_endpoints = vec!["127.0.0.1:2379".into()];
    assert!(c.validate().is_err());
}

#[test]
fn worker_threads_are_one_to_1024_or_one_per_cpu() {
    for good in ["1", "2", "1024"] {
        let c = Config::parse_from(["lease-proxy", "--worker-threads", good]);
        c.validate().unwrap();
        assert_eq!(c.worker_threads, good.parse().ok());
    }
    assert_eq!(Config::parse_from(["lease-proxy"]).worker_threads, None);
    for bad in ["0", "1025"] {
        let c = Config::parse_from(["lease-proxy", "--worker-threads", bad]);
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("--worker-threads"), "{bad}: {e}");
    }
}

#[test]
fn the_dashboards_gateway_is_an_http_url() {
    for good in [
        "http://127.0.0.1:7071",
        "https://fence.example",
        "http://[::1]:7071/",
    ] {
        let c = Config::parse_from(["lease-proxy", "--ui-gateway", good]);
        c.validate().unwrap();
    }
    for bad in ["127.0.0.1:7071", "ftp://x", "/fence"] {
        let c = Config::parse_from(["lease-proxy", "--ui-gateway", bad]);
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("--ui-gateway"), "{bad}: {e}");
    }
}

/// The defaults with `tweak` applied: refused, with the error's text.
fn refused(tweak: &dyn Fn(&mut Config)) -> String {
    let mut c = Config::parse_from(["lease-proxy"]);
    tweak(&mut c);
    c.validate().unwrap_err().to_string()
}

/// The defaults with `tweak` applied: valid.
fn ok(tweak: &dyn Fn(&mut Config)) {
    let mut c = Config::parse_from(["lease-proxy"]);
    tweak(&mut c);
    c.validate().unwrap();
}

#[test]
fn server_tls_settings_go_together_and_their_files_load() {
    let pki = lease_proxy_testkit::pki::Pki::new("config");
    let server = pki.server("server");
    ok(&|c| {
        c.tls_cert = Some(server.cert.clone());
        c.tls_key = Some(server.key.clone());
        c.tls_client_ca = Some(pki.ca().to_owned());
    });
    let err = refused(&|c| c.tls_cert = Some(server.cert.clone()));
    assert!(err.contains("go together"), "{err}");
    let err = refused(&|c| c.tls_client_ca = Some(pki.ca().to_owned()));
    assert!(err.contains("needs --tls-cert"), "{err}");
    let err = refused(&|c| {
        c.tls_cert = Some(server.cert.clone());
        c.tls_key = Some(server.key.clone());
        c.tls_client_certs = runtime::tls::ClientCerts::Required;
    });
    assert!(err.contains("needs --tls-client-ca"), "{err}");
    let mut c = Config::parse_from(["lease-proxy"]);
    c.key_file = Some(pki.ca().with_file_name("no-key"));
    let err = c.check_key_file().unwrap_err().to_string();
    assert!(err.contains("--key-file"), "{err}");
    // A key that is not the certificate's, a file that is not PEM.
    let other = pki.server("other");
    let err = refused(&|c| {
        c.tls_cert = Some(server.cert.clone());
        c.tls_key = Some(other.key.clone());
    });
    assert!(err.contains("TLS"), "{err}");
    let err = refused(&|c| {
        c.tls_cert = Some(pki.ca().join("missing"));
        c.tls_key = Some(server.key.clone());
    });
    assert!(err.contains("missing"), "{err}");
}

/// Client-side files only for https:// URLs; a user needs its password file, which must hold a
/// password.
#[test]
fn client_tls_and_etcd_credentials_go_together() {
    let pki = lease_proxy_testkit::pki::Pki::new("config-client");
    let server = pki.server("server");
    let err = refused(&|c| c.etcd_ca = Some(pki.ca().to_owned()));
    assert!(err.contains("https://"), "{err}");
    let err = refused(&|c| {
        c.upstream = Some("http://127.0.0.1:1".into());
        c.upstream_ca = Some(pki.ca().to_owned());
    });
    assert!(err.contains("https://"), "{err}");
    ok(&|c| {
        c.upstream = Some("https://127.0.0.1:1".into());
        c.upstream_ca = Some(pki.ca().to_owned());
        c.upstream_cert = Some(server.cert.clone());
        c.upstream_key = Some(server.key.clone());
    });
    let err = refused(&|c| {
        c.upstream = Some("https://127.0.0.1:1".into());
        c.upstream_cert = Some(server.cert.clone());
    });
    assert!(err.contains("needs its key"), "{err}");
    let err = refused(&|c| c.etcd_user = Some("root".into()));
    assert!(err.contains("go together"), "{err}");
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty");
    std::fs::write(&empty, " \n").unwrap();
    let err = refused(&|c| {
        c.etcd_user = Some("root".into());
        c.etcd_password_file = Some(empty.clone());
    });
    assert!(err.contains("empty"), "{err}");
}

#[test]
fn a_token_file_is_checked_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokens");
    let mut c = Config::parse_from(["lease-proxy"]);
    c.auth_tokens = Some(path.clone());
    assert!(c.validate().is_err(), "a missing file");
    std::fs::write(&path, "alice not-a-hash read:*\n").unwrap();
    let err = c.validate().unwrap_err().to_string();
    assert!(err.contains("line 1"), "{err}");
    std::fs::write(&path, format!("alice {} read:*\n", "ab".repeat(32))).unwrap();
    c.validate().unwrap();
}

#[test]
fn quotas_need_authentication_and_sane_values() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokens");
    std::fs::write(&path, format!("alice {} read:*\n", "ab".repeat(32))).unwrap();
    let with = |held: Option<u64>, rate: Option<f64>, auth: bool| {
        let mut c = Config::parse_from(["lease-proxy"]);
        c.quota_held = held;
        c.quota_acquire_rate = rate;
        c.auth_tokens = auth.then(|| path.clone());
        c.validate()
    };
    assert!(with(Some(3), None, false).is_err());
    assert!(with(None, Some(1.0), false).is_err());
    assert!(with(Some(0), None, true).is_err());
    for bad in [0.0, -1.0, f64::NAN, f64::INFINITY, 2e6] {
        assert!(with(None, Some(bad), true).is_err(), "{bad}");
    }
    with(Some(3), Some(0.5), true).unwrap();
    with(None, None, false).unwrap();
}

#[test]
fn the_watch_share_needs_authentication_and_fits_the_replica() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokens");
    std::fs::write(&path, format!("alice {} read:*\n", "ab".repeat(32))).unwrap();
    let with = |share: Option<usize>, max: usize, auth: bool| {
        let mut c = Config::parse_from(["lease-proxy"]);
        c.quota_watch_streams = share;
        c.max_watch_streams = max;
        c.auth_tokens = auth.then(|| path.clone());
        c.validate().map(|()| c.watch_streams_per_principal())
    };
    assert!(with(Some(2), 16, false).is_err());
    assert!(with(Some(0), 16, true).is_err());
    assert!(with(Some(17), 16, true).is_err());
    assert_eq!(with(Some(16), 16, true).unwrap(), Some(16));
    assert_eq!(with(Some(3), 16, true).unwrap(), Some(3));
    assert_eq!(with(None, 16, true).unwrap(), Some(4));
    assert_eq!(with(None, 256, true).unwrap(), Some(64));
    assert_eq!(with(None, 3, true).unwrap(), Some(1));
    assert_eq!(with(None, 16, false).unwrap(), None);
}

#[test]
fn the_fleet_quota_needs_authentication_and_room_for_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokens");
    std::fs::write(&path, format!("alice {} read:*\n", "ab".repeat(32))).unwrap();
    let with = |quota: Option<usize>, auth: bool| {
        let mut c = Config::parse_from(["lease-proxy"]);
        c.quota_fleets = quota;
        c.auth_tokens = auth.then(|| path.clone());
        c.validate().map(|()| c.fleets_per_principal())
    };
    assert!(with(Some(2), false).is_err());
    assert!(with(Some(0), true).is_err());
    assert_eq!(with(Some(2), true).unwrap(), Some(2));
    assert_eq!(with(None, true).unwrap(), Some(DEFAULT_QUOTA_FLEETS));
    assert_eq!(with(None, false).unwrap(), None);
}

#[test]
fn the_v3_namespace_is_disjoint_from_the_proxys_keys() {
    let with = |ns: &str| {
        let mut c = Config::parse_from(["lease-proxy"]);
        c.v3_namespace = Some(ns.into());
        c.validate()
    };
    for ok in [
        "/lease-proxy/v3/kv/",
        "/lease-proxy/v3/kv/team-a/",
        "/apps/",
        "x",
    ] {
        assert!(with(ok).is_ok(), "{ok}");
    }
    for bad in [
        "",
        "/",
        "/lease",
        "/lease-proxy/",
        "/lease-proxy/holders/",
        "/lease-proxy/v3/",
        "/lease-proxy/v3/leases/",
        "/lease-proxy/v3/kv",
        "/lease-proxy/readyz",
        "/lease-proxy/other/",
    ] {
        assert!(with(bad).is_err(), "{bad:?}");
    }
    let mut c = Config::parse_from(["lease-proxy"]);
    c.v3_max_txn_ops = 0;
    assert!(c.validate().is_err());
}

#[test]
fn etcd_api_streams_last_as_their_clients_unless_bounded() {
    assert_eq!(
        Config::parse_from(["lease-proxy"]).v3_watch_max_duration,
        None
    );
    let c = Config::parse_from(["lease-proxy", "--v3-watch-max-duration", "30m"]);
    c.validate().unwrap();
    assert_eq!(c.v3_watch_max_duration, Some(Duration::from_secs(1800)));
    for bad in ["500ms", "25h"] {
        let c = Config::parse_from(["lease-proxy", "--v3-watch-max-duration", bad]);
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("--v3-watch-max-duration"), "{bad}: {e}");
    }
}
