//! The benchmarks run end to end (briefly: figures here mean nothing, only that the tools work
//! and measure what they claim). Needs the `lease-proxy` and `fence-gateway` binaries next to
//! the benchmark binaries; they are built here if missing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;

fn ensure_binaries() {
    lease_proxy_testkit::workspace_binary("lease-proxy");
    lease_proxy_testkit::workspace_binary("fence-gateway");
}

fn json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn leasebench_measures_every_operation_on_both_backends() {
    let exe = Path::new(env!("CARGO_BIN_EXE_leasebench"));
    ensure_binaries();
    let dir = tempfile::tempdir().unwrap();
    let (out, svg) = (dir.path().join("lb.json"), dir.path().join("lb.svg"));
    let status = Command::new(exe)
        .args([
            "--ops",
            "40",
            "--concurrency",
            "1,4",
            "--rounds",
            "1",
            "--held",
            "20",
            "--etcd-watchers",
            "1",
        ])
        .args([
            "--sustain",
            "60",
            "--sustain-for",
            "2s",
            "--sustain-ttl",
            "6",
        ])
        .arg("--json")
        .arg(&out)
        .arg("--chart")
        .arg(&svg)
        .status()
        .unwrap();
    assert!(status.success());
    let doc = json(&out);
    let rows = doc["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 5 * 2);
    for row in rows {
        for backend in ["etcd", "proxy"] {
            let run = &row["backends"][backend];
            assert!(run["ops"].as_u64().unwrap() >= 40, "{row}");
            assert!(run["ops_per_sec"].as_f64().unwrap() > 0.0, "{row}");
        }
        assert!(row["ratio"].as_f64().unwrap() > 0.0);
    }
    // The watcher of every key saw both sides' writes.
    assert_eq!(doc["etcd_watch"]["watchers"], 1, "{}", doc["etcd_watch"]);
    assert!(doc["etcd_watch"]["events"].as_u64().unwrap() > 0);
    let sustained = doc["sustained"].as_array().unwrap();
    assert_eq!(sustained.len(), 3);
    for s in sustained {
        assert_eq!(s["failed"], 0, "{s}");
        assert!(s["renewals"]["ops"].as_u64().unwrap() > 0, "{s}");
    }
    assert!(sustained[0]["rss_mib"].as_f64().unwrap() > 0.0);
    assert!(std::fs::read_to_string(&svg)
        .unwrap()
        .contains("renew: throughput"));
}

#[test]
fn leasebench_measures_sessions_group_commit_and_h2c() {
    let exe = Path::new(env!("CARGO_BIN_EXE_leasebench"));
    ensure_binaries();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("lb.json");
    let status = Command::new(exe)
        .args([
            "--op",
            "session-acquire,acquire,session-keepalive,session-cycle",
        ])
        .args(["--ops", "40", "--concurrency", "1,4", "--rounds", "1"])
        .args(["--held", "10", "--unbatched", "--h2c"])
        // 34 timed loops: without settling etcd before each (0.6 s), as the other runs do.
        .arg("--no-settle")
        .args(["--sustain-sessions", "10", "--per-session", "5"])
        .args(["--sustain-for", "2s", "--sustain-ttl", "6"])
        .arg("--json")
        .arg(&out)
        .status()
        .unwrap();
    assert!(status.success());
    let doc = json(&out);
    let rows = doc["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 4 * 2);
    let columns = |op: &str| -> Vec<&str> {
        match op {
            "session-acquire" | "session-cycle" => vec![
                "etcd",
                "etcd session",
                "proxy batch-max 1",
                "proxy",
                "proxy h2c",
            ],
            "acquire" => vec!["etcd", "proxy batch-max 1", "proxy", "proxy h2c"],
            _ => vec!["etcd", "proxy", "proxy h2c"],
        }
    };
    for row in rows {
        let backends = row["backends"].as_object().unwrap();
        let expected = columns(row["op"].as_str().unwrap());
        assert_eq!(backends.len(), expected.len(), "{row}");
        for backend in expected {
            assert!(backends[backend]["ops"].as_u64().unwrap() >= 40, "{row}");
        }
    }
    let s = &doc["sustained_sessions"];
    assert_eq!(s["held_at_end"], 50, "{s}");
    assert_eq!(s["steady"]["failed"], 0, "{s}");
    assert!(
        s["steady"]["heartbeats"]["ops"].as_u64().unwrap() > 0,
        "{s}"
    );
}

#[test]
fn leasebench_measures_grpc_through_the_proxy_and_straight_to_etcd() {
    let exe = Path::new(env!("CARGO_BIN_EXE_leasebench"));
    ensure_binaries();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("lb.json");
    let ops = "grpc-put,grpc-range,grpc-keepalive,grpc-keepalive-shared,grpc-lock";
    let status = Command::new(exe)
        .args(["--op", ops, "--ops", "20", "--concurrency", "1,4"])
        .args(["--rounds", "1", "--grpc-watchers", "30"])
        .args(["--grpc-watch-channels", "2", "--grpc-watch-puts", "2"])
        .arg("--json")
        .arg(&out)
        .status()
        .unwrap();
    assert!(status.success());
    let doc = json(&out);
    let rows = doc["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 5 * 2);
    for row in rows {
        for backend in ["etcd", "proxy"] {
            assert!(
                row["backends"][backend]["ops"].as_u64().unwrap() >= 20,
                "{row}"
            );
        }
        assert!(row["ratio"].as_f64().unwrap() > 0.0, "{row}");
    }
    let watch = doc["grpc_watch"].as_array().unwrap();
    assert_eq!(watch.len(), 2);
    for side in watch {
        assert_eq!(side["delivered"], 60, "{side}");
        let streams = &side["etcd_watch_streams"];
        let opened = streams["with"].as_f64().unwrap() - streams["before"].as_f64().unwrap();
        match side["via"].as_str().unwrap() {
            "etcd" => assert_eq!(opened, 30.0, "{side}"),
            _ => assert!(opened >= 1.0, "{side}"),
        }
        assert!(
            side["proxy_rss_mib"]["with"].as_f64().unwrap() > 0.0,
            "{side}"
        );
    }
}

#[test]
fn leasebench_measures_the_peers_and_cuts_a_round_at_its_deadline() {
    let exe = Path::new(env!("CARGO_BIN_EXE_leasebench"));
    ensure_binaries();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("lb.json");
    let status = Command::new(exe)
        .args(["--peers", "--op", "grpc-put,grpc-keepalive,renew,lock"])
        .args(["--ops", "20", "--concurrency", "1", "--rounds", "1"])
        .args(["--held", "10", "--round-deadline", "3s"])
        .arg("--json")
        .arg(&out)
        .status()
        .unwrap();
    assert!(status.success());
    let doc = json(&out);
    let rows = doc["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 4);
    for row in rows {
        let grpc = row["op"].as_str().unwrap().starts_with("grpc");
        let sides: &[&str] = if grpc {
            &["grpc-proxy", "pass-through", "proxy", "etcd"]
        } else {
            &["etcd gateway", "proxy /v3", "proxy", "etcd"]
        };
        for side in sides {
            let run = &row["backends"][side];
            // grpc-proxy answers a second keepalive on a stream only when its own lessor next
            // renews the lease (every TTL/3, 20 s here): that loop is cut at the deadline.
            if row["op"] == "grpc-keepalive" && *side == "grpc-proxy" {
                assert_eq!(run["cut_at_deadline"], true, "{row}");
                continue;
            }
            assert!(run["ops"].as_u64().unwrap() >= 20, "{side}: {row}");
            assert!(run.get("cut_at_deadline").is_none(), "{side}: {row}");
        }
        // Each serving process's own CPU time and etcd's.
        let cpu = &row["cpu_ms_per_op"];
        assert!(cpu["proxy"]["side"].as_f64().is_some(), "{row}");
        assert!(cpu["etcd"]["etcd"].as_f64().is_some(), "{row}");
        if grpc {
            assert!(cpu["grpc-proxy"]["side"].as_f64().is_some(), "{row}");
            assert!(cpu["pass-through"]["side"].as_f64().is_some(), "{row}");
        }
    }
}

#[test]
fn leasebench_takes_a_fleet_and_the_naive_members_through_every_event() {
    let exe = Path::new(env!("CARGO_BIN_EXE_leasebench"));
    ensure_binaries();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("lb.json");
    let status = Command::new(exe)
        .args(["--fleet", "12x3", "--fleet-ttl", "2", "--rounds", "1"])
        .arg("--json")
        .arg(&out)
        .status()
        .unwrap();
    assert!(status.success());
    let doc = json(&out);
    let runs = doc["fleet"].as_array().unwrap();
    let sides: Vec<&str> = runs.iter().map(|r| r["side"].as_str().unwrap()).collect();
    assert_eq!(sides, ["proxy", "naive"]);
    for run in runs {
        let events = run["events"].as_array().unwrap();
        let names: Vec<&str> = events
            .iter()
            .map(|e| e["event"].as_str().unwrap())
            .collect();
        let expected: &[&str] = match run["side"].as_str().unwrap() {
            "naive" => &["start", "join", "leave", "death", "attempts"],
            _ => &["start", "join", "leave", "death"],
        };
        assert_eq!(names, expected, "{run}");
        for e in events.iter().filter(|e| e["event"] != "attempts") {
            // Every event ends with every resource owned by a live member, counts within one.
            assert!(e["balanced_ms"].as_f64().is_some(), "{e}");
            assert!(
                e["moves"].as_u64().unwrap() >= e["least_moves"].as_u64().unwrap(),
                "{e}"
            );
            assert!(e["etcd_txns"].as_i64().unwrap() > 0, "{e}");
        }
    }
}

#[test]
fn fencebench_measures_three_backends_against_an_enforcing_gateway() {
    let exe = Path::new(env!("CARGO_BIN_EXE_fencebench"));
    ensure_binaries();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("fb.json");
    let status = Command::new(exe)
        .args(["--ops", "100", "--concurrency", "1,4", "--rounds", "1"])
        .arg("--json")
        .arg(&out)
        .status()
        .unwrap();
    assert!(status.success());
    let rows = json(&out);
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 2 * 2);
    for row in rows {
        for backend in ["bare", "direct", "gateway"] {
            assert!(
                row["backends"][backend]["ops"].as_u64().unwrap() >= 100,
                "{row}"
            );
        }
    }
}
