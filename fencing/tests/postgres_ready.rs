//! Readiness of the PostgreSQL store against a real database (`FENCING_TEST_POSTGRES`): ready
//! means a raise can be made, not merely that a read answers.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{postgres_url, unique};
use fencing::{Admission, GateError, PostgresStore, SharedGate, Token};

/// Polls `gate`'s readiness until it is `want`, for at most `within`.
async fn readiness_becomes(gate: &SharedGate, want: bool, within: Duration) {
    let deadline = tokio::time::Instant::now() + within;
    while gate.ready().await != want {
        assert!(
            tokio::time::Instant::now() < deadline,
            "readiness still {} after {within:?}",
            !want
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
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
    locker
        .batch_execute(&format!(
            "BEGIN; LOCK TABLE {schema}.fence_marks, {schema}.fence_probe IN EXCLUSIVE MODE"
        ))
        .await
        .unwrap();
    let refused = gate.admit("aisle-1", Token::new(0, 2)).await;
    assert!(matches!(refused, Err(GateError::Store(_))), "{refused:?}");
    readiness_becomes(&gate, false, Duration::from_secs(10)).await;
    locker.batch_execute("COMMIT").await.unwrap();
    readiness_becomes(&gate, true, Duration::from_secs(10)).await;
    gate.admit("aisle-1", Token::new(0, 2))
        .await
        .unwrap()
        .complete();
    gate.drain().await;
    drop(gate);
    admin
        .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .await
        .unwrap();
}
