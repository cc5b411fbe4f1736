//! Readiness of the PostgreSQL store against a real database (`FENCING_TEST_POSTGRES`): ready
//! means a raise can be made, not merely that a read answers. And the gateway's start-up log
//! line on that store, which must not show the database password.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{postgres_url, unique};
use fencing::{Admission, GateError, PostgresStore, SharedGate, Token};
use lease_proxy_testkit::poll::until;

/// Polls `gate`'s readiness until it is `want`, for at most `within`.
async fn readiness_becomes(gate: &SharedGate, want: bool, within: Duration) {
    let what = format!("readiness {want}");
    until(within, &what, || async { gate.ready().await == want }).await;
}

/// F4: while another session holds the store's tables locked against writes (reads still
/// answer), every raise fails and the gate is not ready; once the lock is gone it is ready and
/// raises go through. The tables live in a schema of this test's own, so no other test waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_follows_whether_a_raise_can_be_made() {
    let schema = unique("ready").replace('-', "_");
    let (admin, connection) = tokio_postgres::connect(&postgres_url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    admin
        .batch_execute(&format!("CREATE SCHEMA {schema}"))
        .await
        .unwrap();
    let url = postgres_url();
    let sep = if url.contains('?') { '&' } else { '?' };
    let url = format!("{url}{sep}options=-csearch_path%3D{schema}");
    let store = PostgresStore::connect_with_deadline(&url, 2, Duration::from_secs(1))
        .await
        .unwrap();
    let gate = SharedGate::new(store);
    readiness_becomes(&gate, true, Duration::from_secs(10)).await;
    gate.admit("aisle-1", Token::new(0, 1))
        .await
        .unwrap()
        .complete();

    let (locker, connection) = tokio_postgres::connect(&postgres_url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    // Each table a raise writes, locked alone (a probe of a table
    // of its own said ready while the marks were locked). Reads still answer under EXCLUSIVE.
    for (n, lock) in [
        (
            2,
            format!("LOCK TABLE {schema}.fence_marks IN EXCLUSIVE MODE"),
        ),
        (
            3,
            format!("LOCK TABLE {schema}.fence_marks IN ACCESS EXCLUSIVE MODE"),
        ),
        (
            4,
            format!("LOCK TABLE {schema}.fence_inflight IN EXCLUSIVE MODE"),
        ),
    ] {
        locker
            .batch_execute(&format!("BEGIN; {lock}"))
            .await
            .unwrap();
        // A resource of its own each time: a permit's end (a delete, then a notification
        // that joins `fence_marks`) may meet the next lock, and its registration then stays
        // until it expires, holding back higher tokens of its resource.
        let resource = format!("aisle-{n}");
        let refused = gate.admit(&resource, Token::new(0, 1)).await;
        assert!(
            matches!(refused, Err(GateError::Store(_))),
            "{lock}: {refused:?}"
        );
        readiness_becomes(&gate, false, Duration::from_secs(10)).await;
        locker.batch_execute("COMMIT").await.unwrap();
        readiness_becomes(&gate, true, Duration::from_secs(10)).await;
        gate.admit(&resource, Token::new(0, 1))
            .await
            .unwrap()
            .complete();
    }
    // The probe's row is no mark of any resource, and it leaves no registration.
    let resources: Vec<String> = admin
        .query(&format!("SELECT resource FROM {schema}.fence_marks"), &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(
        resources.iter().all(|r| r.starts_with("aisle-")
            || (r.contains('/') && !r.starts_with(fencing::LOCK_RESOURCE_PREFIX))),
        "{resources:?}"
    );
    let registrations: i64 = admin
        .query_one(
            &format!(
                "SELECT count(*) FROM {schema}.fence_inflight WHERE resource NOT LIKE 'aisle-%'"
            ),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(registrations, 0);
    gate.drain().await;
    drop(gate);
    admin
        .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .await
        .unwrap();
}

/// The start-up log line names the store with its credentials redacted, as `--print-config`
/// does (it used to print the PostgreSQL URL, password and all).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_start_up_log_line_does_not_show_the_database_password() {
    use std::io::BufRead as _;
    let url = postgres_url();
    let config: tokio_postgres::Config = url.parse().unwrap();
    let password = String::from_utf8(config.get_password().unwrap().to_vec()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (keys_path, _) = common::key_file(dir.path());
    let port = lease_proxy_testkit::free_port();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_fence-gateway"))
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--upstream", "http://127.0.0.1:9", "--store", &url])
        .arg("--key-file")
        .arg(&keys_path)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (lines, received) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    let mut seen = Vec::new();
    let serving = loop {
        match received.recv_timeout(Duration::from_secs(20)) {
            Ok(line) if line.contains("fence-gateway serving") => break line,
            Ok(line) => seen.push(line),
            Err(e) => {
                let _ = child.kill();
                panic!("no start-up line ({e}); stderr: {seen:#?}");
            }
        }
    };
    let _ = child.kill();
    let _ = child.wait();
    assert!(serving.contains("***@"), "{serving}");
    assert!(!serving.contains(&format!(":{password}@")), "{serving}");
    assert!(
        seen.iter().all(|l| !l.contains(&format!(":{password}@"))),
        "{seen:#?}"
    );
}
