//! The warehouse under chaos, end to end on real processes: etcd, lease-proxy (forwarding and
//! pre-fencing), fence-gateway on SQLite, the inventory service, and robots that are SIGKILLed and
//! SIGSTOPped past their TTL. The audit of the inventory's own write log must find no violation.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, Stdio};
use std::time::Duration;

use lease_proxy_testkit::{free_port, Etcd};

const WAREHOUSE: &str = env!("CARGO_BIN_EXE_warehouse");

struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn wait_ready(url: &str) {
    for _ in 0..300 {
        if reqwest::get(url)
            .await
            .is_ok_and(|r| r.status().is_success() || r.status() == 404)
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{url} did not come up");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_leaves_the_inventory_consistent() {
    let etcd = Etcd::single().await;
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("keys");
    fencing::Keyring::create_file(&key_file, &fencing::KeyId::parse("k1").unwrap()).unwrap();

    let inventory_port = free_port();
    let inventory = format!("http://127.0.0.1:{inventory_port}");
    let _inventory = Killed(
        Command::new(WAREHOUSE)
            .args([
                "inventory",
                "--listen",
                &format!("127.0.0.1:{inventory_port}"),
            ])
            .arg("--db")
            .arg(format!(
                "sqlite:{}",
                dir.path().join("inventory.db").display()
            ))
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_ready(&format!("{inventory}/log")).await;

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let gateway = format!("http://{}", listener.local_addr().unwrap());
    let config = fencing::gateway::GatewayConfig::new(
        inventory.clone(),
        format!("sqlite:{}", dir.path().join("marks.db").display()),
        key_file.clone(),
    );
    tokio::spawn(fencing::gateway::run(
        listener,
        config,
        std::future::pending(),
    ));
    wait_ready(&format!("{gateway}/readyz")).await;

    let mut proxy_config = lease_proxy::Config::with_endpoints(etcd.endpoints());
    proxy_config.key_file = Some(key_file.clone());
    proxy_config.upstream = Some(gateway.clone());
    proxy_config.prefence_url = Some(gateway.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxy = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(lease_proxy::run(
        listener,
        proxy_config,
        std::future::pending(),
    ));
    wait_ready(&format!("{proxy}/readyz")).await;

    let run = tokio::task::spawn_blocking(move || {
        Command::new(WAREHOUSE)
            .args([
                "run",
                "--proxy",
                &proxy,
                "--gateway",
                &gateway,
                "--inventory",
                &inventory,
            ])
            .args([
                "--robots",
                "6",
                "--aisles",
                "3",
                "--ttl",
                "2",
                "--duration",
                "20s",
                "--chaos",
            ])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let report = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "audit failed:\n{report}");
    assert!(
        report.contains("invariant violations:         0"),
        "{report}"
    );
    let applied: usize = report
        .lines()
        .find_map(|l| l.strip_prefix("writes applied:")?.trim().parse().ok())
        .unwrap();
    assert!(
        applied > 50,
        "only {applied} writes: the run proves little\n{report}"
    );
    assert!(report.contains("stalled beyond their TTL"), "{report}");
}
