//! The client over HTTPS (trusting a CA file, presenting a client certificate) and with a
//! bearer token, against a proxy started with TLS and `--auth-tokens`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{start_proxy_with, Etcd};
use lease_proxy_client::{AcquireOptions, Client, Error};
use lease_proxy_testkit::pki::Pki;
use sha2::{Digest, Sha256};

const ALICE: &str = "alice-4e1f0c9b7d2a";

#[tokio::test(flavor = "multi_thread")]
async fn https_with_a_bearer_token_or_a_client_certificate() {
    let etcd = Etcd::shared().await;
    let pki = Pki::new("sdk");
    let server = pki.server("proxy");
    let robot7 = pki.client("robot-7", "robot-7", &[]);
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(
        &tokens,
        format!(
            "alice {} acquire:aisle-,read:*\nrobot-7 cert acquire:dock-,read:dock-\n",
            hex::encode(Sha256::digest(ALICE.as_bytes()))
        ),
    )
    .unwrap();
    let ready = reqwest::Client::builder()
        .use_rustls_tls()
        .add_root_certificate(
            reqwest::Certificate::from_pem(&std::fs::read(pki.ca()).unwrap()).unwrap(),
        )
        .build()
        .unwrap();
    let proxy = start_proxy_with(&etcd, &ready, |c| {
        c.tls_cert = Some(server.cert.clone());
        c.tls_key = Some(server.key.clone());
        c.tls_client_ca = Some(pki.ca().to_owned());
        c.auth_tokens = Some(tokens.clone());
    })
    .await;
    assert!(proxy.url.starts_with("https://"));
    let ttl = Duration::from_secs(10);

    let alice = Client::builder(&proxy.url)
        .ca_file(pki.ca())
        .bearer_token(ALICE)
        .timeout(Duration::from_secs(5))
        .user_agent("sdk-test")
        .build()
        .unwrap();
    let lease = alice
        .acquire("aisle-1", AcquireOptions::new("alice", ttl))
        .await
        .unwrap();
    assert_eq!(
        alice.get("aisle-1").await.unwrap().unwrap().token,
        lease.token()
    );
    match alice
        .grant("dock-1", &AcquireOptions::new("alice", ttl))
        .await
    {
        Err(e @ Error::Problem { status: 403, .. }) => assert_eq!(e.slug(), Some("forbidden")),
        other => panic!("{other:?}"),
    }
    lease.release().await.unwrap();
    assert_eq!(alice.get("aisle-1").await.unwrap(), None);

    // The principal from a client certificate, no token.
    let robot = Client::builder(&proxy.url)
        .ca_file(pki.ca())
        .identity_files(&robot7.cert, &robot7.key)
        .build()
        .unwrap();
    let dock = robot
        .acquire("dock-1", AcquireOptions::new("robot-7", ttl))
        .await
        .unwrap();
    assert_eq!(robot.list("dock-").await.unwrap().len(), 1);
    dock.release().await.unwrap();

    // Neither: 401; not trusting the proxy's CA: a transport error.
    let anonymous = Client::builder(&proxy.url)
        .ca_file(pki.ca())
        .build()
        .unwrap();
    match anonymous.get("aisle-1").await {
        Err(e @ Error::Problem { status: 401, .. }) => {
            assert_eq!(e.slug(), Some("unauthenticated"))
        }
        other => panic!("{other:?}"),
    }
    let untrusting = Client::builder(&proxy.url)
        .bearer_token(ALICE)
        .build()
        .unwrap();
    assert!(matches!(
        untrusting.get("aisle-1").await,
        Err(Error::Http(_))
    ));
}
