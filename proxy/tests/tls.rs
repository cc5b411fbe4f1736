//! TLS on every hop, with certificates generated here (`lease_proxy_testkit::pki`): HTTPS on
//! lease-proxy and fence-gateway, client certificates mapped to principals (common name and
//! DNS name), untrusted client certificates refused, certificates reloaded without a restart
//! (connections already open keep working), pre-fences only from the gateway's allowed
//! principals, the gateway's upstream over HTTPS, and the proxy against an etcd with TLS,
//! client certificates and authentication on.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use lease_proxy_testkit::metrics;
use lease_proxy_testkit::pki::{Issued, Pki};
use lease_proxy_testkit::poll::{answers, until};
use lease_proxy_testkit::recording::Log;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

/// How long a changed certificate may take to be served.
const RELOAD_WITHIN: Duration = Duration::from_secs(15);

const ALICE: &str = "alice-7d1c0e9b44";

/// A client trusting `pki`'s CA, presenting `identity` when given.
fn tls_client(pki: &Pki, identity: Option<&Issued>) -> reqwest::Client {
    let mut builder = reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(
            reqwest::Certificate::from_pem(&std::fs::read(pki.ca()).unwrap()).unwrap(),
        )
        .timeout(Duration::from_secs(10));
    if let Some(id) = identity {
        builder = builder.identity(reqwest::Identity::from_pem(&id.identity_pem()).unwrap());
    }
    builder.build().unwrap()
}

fn serve_tls(config: &mut lease_proxy::Config, server: &Issued, client_ca: Option<&Path>) {
    config.tls_cert = Some(server.cert.clone());
    config.tls_key = Some(server.key.clone());
    config.tls_client_ca = client_ca.map(Path::to_owned);
}

async fn post(client: &reqwest::Client, url: String, body: Value) -> (u16, Value) {
    send(client.post(url).json(&body)).await
}

#[tokio::test(flavor = "multi_thread")]
async fn https_is_served_and_plain_or_untrusted_clients_are_refused() {
    let etcd = Etcd::single().await;
    let pki = Pki::new("test");
    let server = pki.server("proxy");
    let client = tls_client(&pki, None);
    let proxy =
        Proxy::start_https(etcd.endpoints(), &client, |c| serve_tls(c, &server, None)).await;
    assert!(proxy.url.starts_with("https://"));

    let (status, grant) = post(
        &client,
        format!("{}/v1/leases/aisle-1", proxy.url),
        json!({"holder": "robot", "ttl_seconds": 10}),
    )
    .await;
    assert_eq!(status, 201, "{grant}");
    // HTTP/2 is offered (ALPN) and chosen.
    let r = client
        .get(format!("{}/livez", proxy.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.version(), reqwest::Version::HTTP_2);

    // Plain HTTP to the HTTPS port, and a client that does not trust the CA: no answer.
    let plain = proxy.url.replacen("https://", "http://", 1);
    assert!(http().get(format!("{plain}/livez")).send().await.is_err());
    let other = Pki::new("other");
    assert!(tls_client(&other, None)
        .get(format!("{}/livez", proxy.url))
        .send()
        .await
        .is_err());
    proxy.stop().await;
}

fn token_file(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("tokens");
    std::fs::write(
        &path,
        format!(
            "robot-7 cert acquire:aisle-,read:*\n\
             robot-9.fleet.example cert acquire:dock-\n\
             alice {} acquire:*,read:*\n",
            hex::encode(Sha256::digest(ALICE.as_bytes()))
        ),
    )
    .unwrap();
    path
}

#[tokio::test(flavor = "multi_thread")]
async fn client_certificates_name_principals() {
    let etcd = Etcd::single().await;
    let pki = Pki::new("test");
    let dir = tempfile::tempdir().unwrap();
    let tokens = token_file(dir.path());
    let server = pki.server("proxy");
    let robot7 = pki.client("robot-7", "robot-7", &[]);
    let robot9 = pki.client("robot-9", "robot nine", &["robot-9.fleet.example"]);
    let stranger = pki.client("stranger", "stranger", &[]);
    let other = Pki::new("other");
    let untrusted = other.client("robot-7-forged", "robot-7", &[]);

    // Principals from the common name; certificates optional (bearer tokens too).
    let proxy = Proxy::start_https(etcd.endpoints(), &tls_client(&pki, None), |c| {
        serve_tls(c, &server, Some(pki.ca()));
        c.auth_tokens = Some(tokens.clone());
    })
    .await;
    let url = |r: &str| format!("{}/v1/leases/{r}", proxy.url);
    let body = json!({"holder": "h", "ttl_seconds": 10});
    let as_robot7 = tls_client(&pki, Some(&robot7));
    let anonymous = tls_client(&pki, None);

    let (status, grant) = post(&as_robot7, url("aisle-1"), body.clone()).await;
    assert_eq!(status, 201, "{grant}");
    let secret = grant["secret"].as_str().unwrap().to_owned();
    let (status, _) = post(&as_robot7, url("dock-1"), body.clone()).await;
    assert_eq!(status, 403, "robot-7 may not acquire docks");
    let (status, got) = send(as_robot7.get(url("aisle-1"))).await;
    assert_eq!((status, got["holder"].as_str()), (200, Some("h")));
    // A certificate naming no `cert` line; none at all; a certificate from another CA.
    let (status, problem) = post(
        &tls_client(&pki, Some(&stranger)),
        url("aisle-2"),
        body.clone(),
    )
    .await;
    assert_eq!(status, 401, "{problem}");
    let (status, _) = post(&anonymous, url("aisle-2"), body.clone()).await;
    assert_eq!(status, 401);
    assert!(tls_client(&pki, Some(&untrusted))
        .post(url("aisle-2"))
        .json(&body)
        .send()
        .await
        .is_err());
    // A bearer token alone; a token and a certificate naming different principals.
    let (status, _) = post_bearer(&anonymous, url("dock-2"), &body).await;
    assert_eq!(status, 201);
    let (status, problem) = post_bearer(&as_robot7, url("aisle-3"), &body).await;
    assert_eq!(status, 401, "{problem}");
    // Two Authorization headers: refused, whichever comes first.
    for (first, second) in [(ALICE, "garbage"), ("garbage", ALICE)] {
        let (status, _) = send(
            anonymous
                .post(url("dock-3"))
                .header("authorization", format!("Bearer {first}"))
                .header("authorization", format!("Bearer {second}"))
                .json(&body),
        )
        .await;
        assert_eq!(status, 401);
    }
    // robot-7's grant is robot-7's: alice (who may acquire anything) cannot renew or release
    // it even with its secret; robot-7 can.
    let (status, _) = send(
        anonymous
            .post(format!("{}/renew", url("aisle-1")))
            .bearer_auth(ALICE)
            .header("lease-secret", &secret),
    )
    .await;
    assert_eq!(status, 403);
    let (status, problem) = send(
        as_robot7
            .post(format!("{}/renew", url("aisle-1")))
            .header("lease-secret", &secret),
    )
    .await;
    assert_eq!(status, 200, "{problem}");
    let (status, _) = send(
        as_robot7
            .delete(url("aisle-1"))
            .header("lease-secret", &secret),
    )
    .await;
    assert_eq!(status, 204);
    proxy.stop().await;

    // Principals from DNS names; certificates required.
    let as_robot9 = tls_client(&pki, Some(&robot9));
    let proxy = Proxy::start_https(etcd.endpoints(), &as_robot9, |c| {
        serve_tls(c, &server, Some(pki.ca()));
        c.auth_tokens = Some(tokens.clone());
        c.tls_client_certs = runtime::tls::ClientCerts::Required;
        c.tls_client_principal = lease_proxy::CertPrincipal::Dns;
    })
    .await;
    let url = |r: &str| format!("{}/v1/leases/{r}", proxy.url);
    let (status, grant) = post(&as_robot9, url("dock-1"), body.clone()).await;
    assert_eq!(status, 201, "{grant}");
    // robot-7's certificate has no DNS name with a `cert` line (its common name does not
    // count here).
    let (status, _) = post(&as_robot7, url("aisle-1"), body.clone()).await;
    assert_eq!(status, 401);
    // Without a certificate the handshake itself fails, bearer token or not.
    assert!(anonymous
        .post(url("dock-2"))
        .bearer_auth(ALICE)
        .json(&body)
        .send()
        .await
        .is_err());
    proxy.stop().await;
}

async fn post_bearer(client: &reqwest::Client, url: String, body: &Value) -> (u16, Value) {
    send(client.post(url).bearer_auth(ALICE).json(body)).await
}

/// The certificate (DER) a TLS server at `addr` presents now.
async fn presented(pki: &Pki, addr: &str) -> Vec<u8> {
    let mut roots = tokio_rustls::rustls::RootCertStore::empty();
    for cert in rustls_pem_certs(pki.ca()) {
        roots.add(cert).unwrap();
    }
    let config = tokio_rustls::rustls::ClientConfig::builder_with_provider(Arc::new(
        tokio_rustls::rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect("localhost".try_into().unwrap(), tcp)
        .await
        .unwrap();
    tls.get_ref().1.peer_certificates().unwrap()[0].to_vec()
}

fn rustls_pem_certs(path: &Path) -> Vec<tokio_rustls::rustls::pki_types::CertificateDer<'static>> {
    use tokio_rustls::rustls::pki_types::pem::PemObject;
    tokio_rustls::rustls::pki_types::CertificateDer::pem_file_iter(path)
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

fn der_of(path: &Path) -> Vec<u8> {
    rustls_pem_certs(path)[0].to_vec()
}

/// `lease_proxy_reloads_total{file="tls",outcome}` from the proxy's `/metrics`.
async fn tls_reloads(client: &reqwest::Client, url: &str, outcome: &str) -> f64 {
    let outcome = format!(r#"outcome="{outcome}""#);
    let labels = [r#"file="tls""#, &outcome];
    metrics::value(client, url, "lease_proxy_reloads_total", &labels).await
}

async fn livez(client: &reqwest::Client, url: &str) -> u16 {
    let r = client.get(format!("{url}/livez")).send().await.unwrap();
    r.status().as_u16()
}

/// Replaces `to`'s files with `from`'s, each by a rename (what certificate tooling does).
fn install(from: &Issued, to: &Issued) {
    for (src, dst) in [(&from.key, &to.key), (&from.cert, &to.cert)] {
        let staged = dst.with_extension("staged");
        std::fs::copy(src, &staged).unwrap();
        std::fs::rename(&staged, dst).unwrap();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn certificates_reload_without_a_restart() {
    let etcd = Etcd::single().await;
    let pki = Pki::new("test");
    let live = pki.server("live");
    let first = der_of(&live.cert);
    let client = tls_client(&pki, None);
    let proxy = Proxy::start_https(etcd.endpoints(), &client, |c| serve_tls(c, &live, None)).await;
    let addr = proxy.url.trim_start_matches("https://").to_owned();
    assert_eq!(presented(&pki, &addr).await, first);
    // A connection opened before the reload, kept open across it.
    let before = tls_client(&pki, None);
    assert_eq!(livez(&before, &proxy.url).await, 200);

    let next = pki.server("next");
    install(&next, &live);
    let second = der_of(&live.cert);
    assert_ne!(first, second);
    until(RELOAD_WITHIN, "the new certificate served", || async {
        presented(&pki, &addr).await == second
    })
    .await;
    assert_eq!(livez(&before, &proxy.url).await, 200);

    assert_eq!(tls_reloads(&client, &proxy.url, "refused").await, 0.0);
    let loaded = tls_reloads(&client, &proxy.url, "loaded").await;
    assert!(loaded >= 1.0, "the new certificate's reload is counted");

    // A key that does not parse: the reload is refused (and counted), the certificate in force
    // stays.
    std::fs::write(&live.key, "-----BEGIN PRIVATE KEY-----\nbroken\n").unwrap();
    until(RELOAD_WITHIN, "the broken key refused", || async {
        tls_reloads(&client, &proxy.url, "refused").await == 1.0
    })
    .await;
    assert_eq!(presented(&pki, &addr).await, second);
    assert_eq!(livez(&client, &proxy.url).await, 200);
    // A FIFO nobody writes and an endless device in place of the files: refused without
    // reading (a read would block or never end), the service goes on, and a good pair
    // written afterwards is still picked up.
    std::fs::remove_file(&live.cert).unwrap();
    let fifo = std::process::Command::new("mkfifo")
        .arg(&live.cert)
        .status()
        .unwrap();
    assert!(fifo.success());
    std::fs::remove_file(&live.key).unwrap();
    std::os::unix::fs::symlink("/dev/zero", &live.key).unwrap();
    // A change is read once it has held for a poll, so the steps above are read as one.
    until(RELOAD_WITHIN, "the FIFO and the device refused", || async {
        tls_reloads(&client, &proxy.url, "refused").await == 2.0
    })
    .await;
    assert_eq!(presented(&pki, &addr).await, second);
    assert_eq!(livez(&client, &proxy.url).await, 200);
    std::fs::remove_file(&live.cert).unwrap();
    std::fs::remove_file(&live.key).unwrap();
    let third = pki.server("third");
    install(&third, &live);
    let third = der_of(&live.cert);
    until(RELOAD_WITHIN, "a good pair after a FIFO served", || async {
        presented(&pki, &addr).await == third
    })
    .await;
    proxy.stop().await;
}

/// A recording storage service over HTTPS.
async fn https_storage(server: &Issued) -> (String, Log) {
    let (app, seen) = Storage::builder().router();
    let tls = runtime::tls::ServerTls::load(runtime::tls::ServerFiles {
        cert: server.cert.clone(),
        key: server.key.clone(),
        client_ca: None,
        client_certs: runtime::tls::ClientCerts::Optional,
    })
    .unwrap();
    let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("https://{}", tcp.local_addr().unwrap());
    tokio::spawn(async move {
        let draining = std::sync::atomic::AtomicBool::new(false);
        let _ = runtime::serve::until_shutdown(
            runtime::serve::Listener {
                tcp,
                tls: Some(Arc::new(tls)),
            },
            app,
            std::future::pending(),
            &draining,
            tokio_util::sync::CancellationToken::new(),
            runtime::serve::Drain {
                delay: Duration::ZERO,
                deadline: Duration::from_secs(1),
            },
            runtime::serve::Limits::default(),
        )
        .await;
    });
    (url, seen)
}

#[tokio::test(flavor = "multi_thread")]
async fn the_gateway_serves_https_and_takes_pre_fences_only_from_its_principals() {
    let etcd = Etcd::single().await;
    let pki = Pki::new("test");
    let dir = tempfile::tempdir().unwrap();
    let key_file = key_file(dir.path());
    let (storage, seen) = https_storage(&pki.server("storage")).await;

    // The gateway: HTTPS, client certificates optional, pre-fences from proxy-a only, its
    // upstream over HTTPS verified against the test CA.
    let gateway_cert = pki.server("gateway");
    let mut config = fencing::gateway::GatewayConfig::new(&storage, "memory", key_file.clone());
    config.tls_cert = Some(gateway_cert.cert.clone());
    config.tls_key = Some(gateway_cert.key.clone());
    config.tls_client_ca = Some(pki.ca().to_owned());
    config.fence_principals = vec!["proxy-a".into()];
    config.upstream_ca = Some(pki.ca().to_owned());
    config.validate().unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let gateway = format!("https://{}", listener.local_addr().unwrap());
    tokio::spawn(fencing::gateway::run(
        listener,
        config,
        std::future::pending(),
    ));
    let anonymous = tls_client(&pki, None);
    let readyz = format!("{gateway}/readyz");
    answers(&anonymous, &readyz, 200, Duration::from_secs(10)).await;

    let proxy_for = |cert: Issued| {
        let gateway = gateway.clone();
        let ca = pki.ca().to_owned();
        move |c: &mut lease_proxy::Config| {
            c.upstream = Some(gateway.clone());
            c.prefence_url = Some(gateway.clone());
            c.ui_gateway = Some(gateway.clone());
            c.upstream_ca = Some(ca);
            c.upstream_cert = Some(cert.cert);
            c.upstream_key = Some(cert.key);
        }
    };
    let a = Proxy::start_with_keys(
        etcd.endpoints(),
        key_file.clone(),
        proxy_for(pki.client("proxy-a", "proxy-a", &[])),
    )
    .await;
    let b = Proxy::start_with_keys(
        etcd.endpoints(),
        key_file.clone(),
        proxy_for(pki.client("proxy-b", "proxy-b", &[])),
    )
    .await;

    // proxy-a: the grant is pre-fenced over mTLS, the write goes gateway → storage over HTTPS.
    let (status, grant) = acquire(&a, "aisle-1", "robot", 10).await;
    assert_eq!(status, 201, "{grant}");
    let secret = grant["secret"].as_str().unwrap().to_owned();
    let (status, _) = send(
        http()
            .put(format!("{}/v1/leases/aisle-1/forward/items/aisle-1", a.url))
            .header("lease-secret", &secret)
            .body("42"),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(
        seen.all().iter().map(|w| w.token()).collect::<Vec<_>>(),
        [grant["fencing_token"].as_str().unwrap()]
    );
    // The forward route reaches neither the gateway's pre-fence route nor its feed (which
    // names every tenant's resources): the proxy's client certificate, which
    // --fence-principals trusts, is not the holder's to use.
    for path in [
        "fence/aisle-1",
        "fence",
        "fence-gateway/feed",
        "fence-gateway",
    ] {
        for method in [reqwest::Method::POST, reqwest::Method::GET] {
            let (status, problem) = send(
                http()
                    .request(
                        method.clone(),
                        format!("{}/v1/leases/aisle-1/forward/{path}", a.url),
                    )
                    .header("lease-secret", &secret),
            )
            .await;
            assert_eq!(status, 404, "{method} {path}: {problem}");
        }
    }
    // The dashboard's relay reads the feed with the proxy's certificate, which the gateway
    // trusts (proxy-b's it does not).
    let (status, feed) = send(http().get(format!("{}/ui/enforcer", a.url))).await;
    assert_eq!(status, 200, "{feed}");
    assert_eq!(feed["marks"][0]["resource"], "aisle-1", "{feed}");
    let (status, _) = send(http().get(format!("{}/ui/enforcer", b.url))).await;
    assert_eq!(status, 502);
    // proxy-b's pre-fence is refused by the gateway: its grant is withdrawn, nothing held.
    let (status, problem) = acquire(&b, "aisle-2", "robot", 10).await;
    assert_eq!(status, 503, "{problem}");
    let (status, _) = send(http().get(format!("{}/v1/leases/aisle-2", a.url))).await;
    assert_eq!(status, 404);
    // Straight at the gateway: no certificate, or one naming nobody allowed → 403; plain HTTP
    // gets no answer.
    let token = grant["fencing_token"].as_str().unwrap().to_owned();
    for client in [
        anonymous.clone(),
        tls_client(&pki, Some(&pki.client("proxy-c", "proxy-c", &[]))),
    ] {
        let (status, problem) = send(
            client
                .post(format!("{gateway}/fence/aisle-1"))
                .header(fencing::TOKEN_HEADER, &token),
        )
        .await;
        assert_eq!(status, 403, "{problem}");
        let (status, problem) = send(client.get(format!("{gateway}/fence-gateway/feed"))).await;
        assert_eq!(status, 403, "the feed: {problem}");
    }
    let plain = gateway.replacen("https://", "http://", 1);
    assert!(http().get(format!("{plain}/readyz")).send().await.is_err());
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_proxy_works_against_etcd_with_tls_client_certificates_and_auth() {
    let pki = Pki::new("etcd");
    let etcd = lease_proxy_testkit::Etcd::secured(&pki, "s3cret-root").await;
    let security = etcd.security().unwrap().clone();
    let dir = tempfile::tempdir().unwrap();
    let password = dir.path().join("etcd-password");
    std::fs::write(&password, "s3cret-root\n").unwrap();
    let secured = |c: &mut lease_proxy::Config| {
        c.etcd_ca = Some(security.ca.clone());
        c.etcd_cert = Some(security.client.cert.clone());
        c.etcd_key = Some(security.client.key.clone());
        c.etcd_user = Some("root".into());
        c.etcd_password_file = Some(password.clone());
    };
    assert!(etcd.endpoints()[0].starts_with("https://"));
    let proxy = Proxy::start(etcd.endpoints(), secured).await;
    let (status, grant) = acquire(&proxy, "aisle-1", "robot", 3).await;
    assert_eq!(status, 201, "{grant}");
    let secret = grant["secret"].as_str().unwrap().to_owned();
    // Renewals go through the keep-alive streams (authenticated too), past the TTL.
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let (status, body) = renew(&proxy, "aisle-1", &secret).await;
        assert_eq!(status, 200, "{body}");
    }
    let (status, _) = send(
        http()
            .post(format!("{}/v3/kv/put", proxy.url))
            .json(&json!({"key": "YQ==", "value": "Yg=="})),
    )
    .await;
    assert_eq!(status, 200);
    let (status, _) = release(&proxy, "aisle-1", &secret).await;
    assert_eq!(status, 204);
    proxy.stop().await;

    // A wrong password, or no client certificate: the proxy does not start (and says why).
    let wrong = dir.path().join("wrong");
    std::fs::write(&wrong, "guess").unwrap();
    for tweak in [
        Box::new(|c: &mut lease_proxy::Config| c.etcd_password_file = Some(wrong.clone()))
            as Box<dyn Fn(&mut lease_proxy::Config)>,
        Box::new(|c: &mut lease_proxy::Config| {
            c.etcd_cert = None;
            c.etcd_key = None;
        }),
    ] {
        let mut config = lease_proxy::Config::with_endpoints(etcd.endpoints());
        config.data_dir = dir.path().to_owned();
        secured(&mut config);
        tweak(&mut config);
        config.validate().unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let started = tokio::time::timeout(
            Duration::from_secs(20),
            lease_proxy::run(listener, config, std::future::pending()),
        )
        .await
        .expect("the proxy neither started nor failed");
        assert!(started.is_err());
    }
}
