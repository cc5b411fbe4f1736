//! The gate forgets idle resources: 100,000 distinct resources written once, then idle, leave
//! the gate's memory near where it started once the idle timeout has passed. Measured with a
//! counting allocator (bytes live on the heap), on a paused clock: nothing here is timed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use fencing::{Gate, HighWaterMarks, StoreError, Token};
use futures::future::BoxFuture;
use stats_alloc::{StatsAlloc, INSTRUMENTED_SYSTEM};

#[global_allocator]
static ALLOCATOR: &StatsAlloc<std::alloc::System> = &INSTRUMENTED_SYSTEM;

/// Bytes live on the heap now.
fn live() -> isize {
    let stats = ALLOCATOR.stats();
    stats.bytes_allocated as isize - stats.bytes_deallocated as isize + stats.bytes_reallocated
}

/// Marks kept outside this process (as in SQLite or PostgreSQL): the measurement is the gate's
/// own memory. Every resource is new to it.
struct Elsewhere;

impl HighWaterMarks for Elsewhere {
    fn get<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<Option<Token>, StoreError>> {
        Box::pin(async { Ok(None) })
    }

    fn raise<'a>(&'a self, _: &'a str, token: Token) -> BoxFuture<'a, Result<Token, StoreError>> {
        Box::pin(async move { Ok(token) })
    }

    fn probe(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async { Ok(()) })
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn idle_resources_are_forgotten() {
    const IDLE: Duration = Duration::from_secs(60);
    let gate = Gate::new(Elsewhere).with_idle_eviction(IDLE);
    let names: Vec<String> = (0..100_000).map(|i| format!("aisle-{i:06}")).collect();
    gate.admit("warm-up", Token::new(0, 1))
        .await
        .unwrap()
        .complete();
    let baseline = live();
    for name in &names {
        gate.admit(name, Token::new(0, 7)).await.unwrap().complete();
    }
    let peak = live();
    assert!(gate.resident() > 100_000);
    tokio::time::advance(IDLE + Duration::from_secs(1)).await;
    // The next write sweeps.
    gate.admit("warm-up", Token::new(0, 1))
        .await
        .unwrap()
        .complete();
    let after = live();
    let grown = peak - baseline;
    let kept = after - baseline;
    println!(
        "gate memory: {} B per resource while resident; {kept} B kept after eviction",
        grown / 100_000
    );
    assert!(
        gate.resident() <= 1,
        "{} resources still resident",
        gate.resident()
    );
    assert!(
        kept < grown / 20,
        "after eviction the gate keeps {kept} of the {grown} bytes 100,000 resources took"
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_resource_in_use_or_uncertain_is_kept_and_its_mark_never_lowered() {
    const IDLE: Duration = Duration::from_secs(60);
    let gate = Gate::new(fencing::MemoryStore::new())
        .with_idle_eviction(IDLE)
        .with_write_grace(Duration::from_secs(600));
    let held = gate.admit("held", Token::new(0, 5)).await.unwrap();
    gate.admit("uncertain", Token::new(0, 5))
        .await
        .unwrap()
        .uncertain();
    gate.admit("done", Token::new(0, 5))
        .await
        .unwrap()
        .complete();
    tokio::time::advance(IDLE * 2).await;
    gate.admit("other", Token::new(0, 1))
        .await
        .unwrap()
        .complete();
    // "held" and "uncertain" stay; "done" was forgotten, but its mark was not.
    assert_eq!(gate.resident(), 3);
    assert!(gate.admit("done", Token::new(0, 4)).await.is_err());
    // The uncertain write still holds off a higher token.
    let raise = tokio::time::timeout(
        Duration::from_secs(60),
        gate.admit("uncertain", Token::new(0, 6)),
    );
    assert!(
        raise.await.is_err(),
        "raised while an uncertain write's grace was running"
    );
    held.complete();
}
