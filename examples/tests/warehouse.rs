//! The warehouse under chaos, end to end on real processes: etcd, lease-proxy (forwarding and
//! pre-fencing), fence-gateway on SQLite in path mode (`/aisles/{resource}`, as `scripts/run.sh`
//! runs it), the inventory service, and a fleet of robots that are SIGKILLed, SIGSTOPped past
//! their TTL and redeployed one by one (drained, restarted). The audit of the inventory's own
//! write log must find no violation, and the fleet's ledger no two holders at once. And the
//! resource binding: a token for one aisle never writes another, whichever mode the gateway
//! runs in.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use futures::StreamExt;
use lease_proxy_client::{Client, FleetSpec, JoinOptions, Lease, Member};
use lease_proxy_testkit::{free_port, Etcd};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::ChildStdout;

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

/// The inventory service on a free port, its database in `dir`.
async fn start_inventory(dir: &Path) -> (Killed, String) {
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let inventory = Killed(
        Command::new(WAREHOUSE)
            .args(["inventory", "--listen", &format!("127.0.0.1:{port}")])
            .arg("--db")
            .arg(format!("sqlite:{}", dir.join("inventory.db").display()))
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_ready(&format!("{url}/log")).await;
    (inventory, url)
}

/// fence-gateway in process in front of `inventory`, its marks in `marks`; in path mode when
/// `resource_path` is given, else in header mode.
async fn start_gateway(
    inventory: &str,
    marks: &Path,
    key_file: &Path,
    resource_path: Option<&str>,
) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let gateway = format!("http://{}", listener.local_addr().unwrap());
    let mut config = fencing::gateway::GatewayConfig::new(
        inventory,
        format!("sqlite:{}", marks.display()),
        key_file.to_owned(),
    );
    config.resource_path = resource_path.map(str::to_owned);
    // As scripts/run.sh: the inventory answers in milliseconds, so a robot killed mid-write
    // holds its aisle for 2 s, not the default 10.
    config.write_grace = std::time::Duration::from_secs(2);
    tokio::spawn(fencing::gateway::run(
        listener,
        config,
        std::future::pending(),
    ));
    wait_ready(&format!("{gateway}/readyz")).await;
    gateway
}

/// The demo's stack: etcd, the inventory, fence-gateway in path mode in front of it, and
/// lease-proxy forwarding to and pre-fencing the gateway.
struct Stack {
    _etcd: std::sync::Arc<Etcd>,
    _dir: tempfile::TempDir,
    _inventory: Killed,
    inventory: String,
    gateway: String,
    proxy: String,
}

async fn start_stack() -> Stack {
    let etcd = Etcd::shared().await;
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("keys");
    fencing::Keyring::create_file(&key_file, &fencing::KeyId::parse("k1").unwrap()).unwrap();

    let (inventory_process, inventory) = start_inventory(dir.path()).await;
    let gateway = start_gateway(
        &inventory,
        &dir.path().join("marks.db"),
        &key_file,
        Some("/aisles/{resource}"),
    )
    .await;

    let mut proxy_config = lease_proxy::Config::with_endpoints(etcd.endpoints());
    proxy_config.key_file = Some(key_file.clone());
    proxy_config.etcd_prefix = lease_proxy_testkit::prefix("warehouse");
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
    Stack {
        _etcd: etcd,
        _dir: dir,
        _inventory: inventory_process,
        inventory,
        gateway,
        proxy,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_leaves_the_inventory_consistent() {
    let stack = start_stack().await;
    let (proxy, gateway, inventory) = (
        stack.proxy.clone(),
        stack.gateway.clone(),
        stack.inventory.clone(),
    );
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
                "5",
                "--aisles",
                "10",
                "--ttl",
                "2",
                "--drain",
                "1s",
                "--duration",
                "20s",
                "--chaos",
                "--deploy",
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
    // A robot was stalled past its TTL (the first chaos event is a stall): its aisles moved.
    let stalled: usize = report
        .lines()
        .find_map(|l| {
            let (head, _) = l.split_once(" stalled beyond their TTL")?;
            head.rsplit(' ').next()?.parse().ok()
        })
        .unwrap_or_else(|| panic!("{report}"));
    assert!(stalled >= 1, "{report}");
    assert!(report.contains("; stall "), "{report}");
    // The rolling deploy drained and restarted at least one robot, and its drain moved aisles.
    let deployed: usize = report
        .lines()
        .find_map(|l| {
            let (_, rest) = l.split_once("stalled beyond their TTL, ")?;
            rest.split_whitespace().next()?.parse().ok()
        })
        .unwrap();
    assert!(deployed >= 1, "{report}");
    assert!(
        report.contains("moves per robot event:        drain"),
        "{report}"
    );
    // Coverage was measured: every aisle was held at once, the gaps are counted.
    let unowned: f64 = report
        .lines()
        .find_map(|l| {
            l.strip_prefix("aisle-seconds unowned:")?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("{report}"));
    assert!(unowned >= 0.0);
    println!("{report}");
}

/// `kill -{sig} {pid}`.
fn kill(sig: &str, pid: u32) {
    let status = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .unwrap();
    assert!(status.success(), "kill -{sig} {pid}");
}

/// The next line a robot prints (its `event …` lines), or `None` once it exited.
async fn next_event(events: &mut Lines<BufReader<ChildStdout>>) -> Option<String> {
    tokio::time::timeout(Duration::from_secs(20), events.next_line())
        .await
        .expect("the robot said nothing for 20 s")
        .unwrap()
}

/// The next change of `member`'s assignment that grants `aisle`: its guard.
async fn granted(member: &Member, aisle: &str, within: Duration) -> Lease {
    let mut changes = member.assignments();
    tokio::time::timeout(within, async {
        loop {
            let change = changes.next().await.unwrap().unwrap();
            if let Some(lease) = change.added.into_iter().find(|l| l.resource() == aisle) {
                return lease;
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{aisle} not granted within {within:?}"))
}

fn acquired_token(line: &str, aisle: &str) -> u64 {
    line.strip_prefix(&format!("event acquired {aisle} "))
        .unwrap_or_else(|| panic!("{line}"))
        .parse()
        .unwrap()
}

/// A robot is a fleet member on the SDK. Granted aisle-1, it counts it; stopped (SIGSTOP) past
/// its TTL while it counts, the aisle goes to another member meanwhile; resumed, it walks away
/// without sending the count it was making (no write under its lapsed token is even tried) and
/// joins again. On SIGTERM it drains: the aisle it holds is handed to the other member at once
/// (it releases it, well before the service's deadline would), and it leaves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_robot_stops_at_the_lost_signal_and_hands_off_on_sigterm() {
    let stack = start_stack().await;
    let client = Client::new(&stack.proxy).unwrap();
    let drain = Duration::from_secs(10);
    client
        .put_fleet("dock", &FleetSpec::new(["aisle-1"]).drain(drain))
        .await
        .unwrap();
    let mut robot = tokio::process::Command::new(WAREHOUSE)
        .args([
            "robot",
            "--proxy",
            &stack.proxy,
            "--gateway",
            &stack.gateway,
        ])
        .args(["--fleet", "dock", "--name", "robot-z", "--ttl", "2"])
        // Straight to the gateway: nothing but the robot itself checks the lease before it
        // writes (through the proxy, the SDK's forward would refuse too).
        .arg("--direct")
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let pid = robot.id().unwrap();
    let mut events = BufReader::new(robot.stdout.take().unwrap()).lines();
    assert_eq!(
        next_event(&mut events).await.as_deref(),
        Some("event joined dock")
    );
    let first = acquired_token(&next_event(&mut events).await.unwrap(), "aisle-1");
    // Stopped while it counts (its first count takes at least 100 ms), until the aisle has
    // been granted to another member: its session lapsed meanwhile.
    kill("STOP", pid);
    let other = client
        .join_fleet("dock", JoinOptions::new("other", Duration::from_secs(30)))
        .await
        .unwrap();
    let takeover = granted(&other, "aisle-1", Duration::from_secs(15)).await;
    assert!(takeover.token() > first);
    kill("CONT", pid);
    let lost = next_event(&mut events).await.unwrap();
    assert!(lost.starts_with("event lost aisle-1 "), "{lost}");
    assert_eq!(
        next_event(&mut events).await.as_deref(),
        Some("event rejoined dock")
    );
    // The other member leaves: the aisle comes back to the robot, under a larger token.
    let second = takeover.token();
    drop(takeover);
    other.leave().await.unwrap();
    let third = acquired_token(&next_event(&mut events).await.unwrap(), "aisle-1");
    assert!(third > second);
    // A deploy: another member is there to take the aisle; SIGTERM drains the robot.
    let next = client
        .join_fleet("dock", JoinOptions::new("next", Duration::from_secs(30)))
        .await
        .unwrap();
    let terminated = tokio::time::Instant::now();
    kill("TERM", pid);
    let handed = granted(&next, "aisle-1", Duration::from_secs(15)).await;
    let took = terminated.elapsed();
    assert!(handed.token() > third);
    assert!(
        took < drain / 2,
        "handed off after {took:?}: not released by the robot"
    );
    let mut rest = Vec::new();
    while let Some(line) = next_event(&mut events).await {
        rest.push(line);
    }
    let status = robot.wait().await.unwrap();
    assert!(status.success(), "{status}: {rest:?}");
    // Drained (the hand-off may be told first), then gone: nothing else happened.
    let mut ends: Vec<&str> = rest
        .iter()
        .map(String::as_str)
        .filter(|l| *l != "event write-ok aisle-1")
        .collect();
    assert_eq!(ends.pop(), Some("event left dock"), "{rest:?}");
    ends.sort_unstable();
    assert_eq!(
        ends,
        ["event draining dock", "event handed-off aisle-1"],
        "{rest:?}"
    );
    let log: Vec<serde_json::Value> = reqwest::get(format!("{}/log", stack.inventory))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let first = i64::try_from(first).unwrap();
    assert!(
        log.iter().all(|w| w["revision"].as_i64() != Some(first)),
        "a write under the lapsed token reached the inventory: {log:?}"
    );
    drop(handed);
    next.leave().await.unwrap();
}

/// A holder of aisle-3 cannot write aisle-2: in path mode the gateway refuses (the path names the
/// resource fenced); in header mode the gateway fences the header's aisle and the inventory
/// refuses a path naming another (it writes only the verified `Fencing-Resource`). Nothing but
/// aisle-3's writes reaches the inventory's log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_for_one_aisle_never_writes_another() {
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("keys");
    fencing::Keyring::create_file(&key_file, &fencing::KeyId::parse("k1").unwrap()).unwrap();
    let keys = fencing::Keyring::load(&key_file).unwrap();
    let (_inventory, inventory) = start_inventory(dir.path()).await;
    let by_path = start_gateway(
        &inventory,
        &dir.path().join("path.db"),
        &key_file,
        Some("/aisles/{resource}"),
    )
    .await;
    let by_header = start_gateway(&inventory, &dir.path().join("header.db"), &key_file, None).await;
    let token = keys.mint("aisle-3", fencing::Token::new(0, 5));
    let client = reqwest::Client::new();
    let put = |base: &str, aisle: &str, resources: &[&str]| {
        let mut request = client
            .put(format!("{base}/aisles/{aisle}/count"))
            .header("fencing-token", &token)
            .json(&serde_json::json!({"robot": "r", "count": 1}));
        for r in resources {
            request = request.header("fencing-resource", *r);
        }
        request
    };
    // (what, request, status, refused by: the gateway's slug, or "" for the inventory)
    let cases = [
        (
            "path mode, own aisle",
            put(&by_path, "aisle-3", &[]),
            200,
            "",
        ),
        (
            "path mode, own aisle, header too",
            put(&by_path, "aisle-3", &["aisle-3"]),
            200,
            "",
        ),
        (
            "path mode, other aisle",
            put(&by_path, "aisle-2", &[]),
            403,
            "wrong-resource-fencing-token",
        ),
        (
            "path mode, other aisle, own header",
            put(&by_path, "aisle-2", &["aisle-3"]),
            403,
            "fencing-resource-mismatch",
        ),
        (
            "header mode, own aisle",
            put(&by_header, "aisle-3", &["aisle-3"]),
            200,
            "",
        ),
        (
            "header mode, other aisle",
            put(&by_header, "aisle-2", &["aisle-3"]),
            403,
            "",
        ),
        (
            "inventory, no Fencing-Resource",
            put(&inventory, "aisle-3", &[]),
            403,
            "",
        ),
        (
            "inventory, two Fencing-Resource",
            put(&inventory, "aisle-3", &["aisle-3", "aisle-3"]),
            403,
            "",
        ),
        (
            "inventory, other aisle",
            put(&inventory, "aisle-2", &["aisle-3"]),
            403,
            "",
        ),
    ];
    for (what, request, status, slug) in cases {
        let response = request.send().await.unwrap();
        assert_eq!(response.status().as_u16(), status, "{what}");
        let refused_by = response
            .headers()
            .get(fencing::REJECTION_HEADER)
            .map(|v| v.to_str().unwrap().to_owned())
            .unwrap_or_default();
        assert_eq!(refused_by, slug, "{what}");
        if status == 403 {
            assert_eq!(
                response.headers()["content-type"],
                "application/problem+json",
                "{what}"
            );
        }
    }
    let log: Vec<serde_json::Value> = reqwest::get(format!("{inventory}/log"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let aisles: Vec<&str> = log.iter().map(|w| w["aisle"].as_str().unwrap()).collect();
    assert_eq!(aisles, ["aisle-3", "aisle-3", "aisle-3"]);
}
