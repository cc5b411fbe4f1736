//! Sustained sessions: `sessions` sessions with the real TTL, each holding `per_session`
//! resources, heartbeats every TTL/3 on the open-loop schedule of `held` — already while the
//! resources are being acquired (the setup takes longer than a TTL), then for the measured
//! window. Ends by checking, through `GET /v1/sessions/{id}`, that every resource is still held.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use futures::StreamExt;
use lease_proxy_benches::stack;
use lease_proxy_benches::stats::ms;
use serde_json::json;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::held::{self, Sustained};
use crate::http::Proxy;
use crate::sessions::{self, Heartbeats, SessionBackend};

/// What to run.
pub(crate) struct Plan {
    /// Sessions opened.
    pub(crate) sessions: usize,
    /// Resources acquired under each.
    pub(crate) per_session: usize,
    /// The sessions' TTL, seconds; heartbeats every TTL/3.
    pub(crate) ttl: u64,
    /// The measured window after setup.
    pub(crate) window: Duration,
    /// Most heartbeats outstanding at once.
    pub(crate) max_in_flight: usize,
    /// Acquires in flight during setup.
    pub(crate) setup_in_flight: usize,
}

/// Runs `plan` through `proxy` (whose pid, if known, gives its memory); prints a summary and
/// returns it as JSON.
pub(crate) async fn run(
    plan: &Plan,
    proxy: &Arc<Proxy>,
    pid: Option<u32>,
) -> anyhow::Result<serde_json::Value> {
    let period = Duration::from_secs(plan.ttl) / 3;
    let opened = Instant::now();
    let all = Arc::new(sessions::open_all(proxy, plan.sessions, plan.ttl, 64).await?);
    let open_secs = opened.elapsed().as_secs_f64();
    let beats = Arc::new(Heartbeats(proxy.clone()));

    // Heartbeats start before the resources are taken: the sessions have their real TTL.
    let stop = CancellationToken::new();
    let during_setup = tokio::spawn({
        let (beats, all, stop) = (beats.clone(), all.clone(), stop.clone());
        let (max, limit) = (plan.max_in_flight, Duration::from_secs(24 * 3600));
        async move { held::sustain_until(&beats, all, period, limit, max, &stop).await }
    });
    let setup_started = Instant::now();
    let acquired = acquire_under(proxy, &all, plan.per_session, plan.setup_in_flight).await;
    let setup_secs = setup_started.elapsed().as_secs_f64();
    stop.cancel();
    let setup = during_setup.await.context("heartbeats during setup")??;
    acquired?;
    let window =
        held::sustain(&beats, all.clone(), period, plan.window, plan.max_in_flight).await?;
    let memory = pid.and_then(stack::rss_mib);

    let (held_now, short) = count_held(proxy, &all, plan.per_session).await?;
    sessions::close_all(proxy, &all, 64).await?;

    let expected = plan.sessions * plan.per_session;
    let phase = |name: &str, s: &Sustained| {
        let late = s.late;
        println!(
            "| {name} | {} | {} | {} | {:.1} / {:.1} / {:.1} | {} |",
            s.offered,
            s.run.ops,
            late,
            ms(s.run.p50),
            ms(s.run.p99),
            ms(s.run.max),
            s.failed
        );
        if let Some(f) = &s.first_failure {
            eprintln!("first heartbeat failure ({name}): {f}");
        }
        json!({
            "offered": s.offered,
            "heartbeats": s.run.json(),
            "late": late,
            "failed": s.failed,
            "first_failure": s.first_failure,
        })
    };
    println!(
        "\n{} sessions × {} resources, TTL {} s, heartbeat every {:.1} s; setup {setup_secs:.1} s ({:.0} acquires/s)",
        plan.sessions,
        plan.per_session,
        plan.ttl,
        period.as_secs_f64(),
        expected as f64 / setup_secs
    );
    println!("\n| phase | heartbeats offered | answered | later than TTL/3 | p50 / p99 / max ms | failed |");
    println!("|---|--:|--:|--:|--:|--:|");
    let setup_json = phase("during setup (acquires in flight)", &setup);
    let window_json = phase(&format!("steady, {} s", plan.window.as_secs()), &window);
    let rss = memory.map_or_else(
        || "–".to_owned(),
        |(rss, peak)| format!("{rss:.0} MiB (peak {peak:.0})"),
    );
    println!(
        "\nheld at the end: {held_now} of {expected} ({short} sessions short); proxy RSS {rss}"
    );
    Ok(json!({
        "sessions": plan.sessions,
        "per_session": plan.per_session,
        "ttl_seconds": plan.ttl,
        "heartbeat_period_seconds": period.as_secs_f64(),
        "open_seconds": open_secs,
        "setup_seconds": setup_secs,
        "setup_acquires_per_sec": expected as f64 / setup_secs,
        "window_seconds": plan.window.as_secs_f64(),
        "during_setup": setup_json,
        "steady": window_json,
        "expected_held": expected,
        "held_at_end": held_now,
        "sessions_short": short,
        "rss_mib": memory.map(|m| m.0),
        "peak_rss_mib": memory.map(|m| m.1),
    }))
}

/// Acquires `per_session` distinct resources under each session, `in_flight` at once.
async fn acquire_under(
    proxy: &Arc<Proxy>,
    all: &Arc<Vec<<Proxy as SessionBackend>::Session>>,
    per_session: usize,
    in_flight: usize,
) -> anyhow::Result<()> {
    let pid = std::process::id();
    let work = (0..per_session).flat_map(|i| (0..all.len()).map(move |s| (s, i)));
    let mut acquiring = futures::stream::iter(work.map(|(s, i)| {
        let (proxy, all) = (proxy.clone(), all.clone());
        async move {
            let session = &all[s];
            let resource = format!("lb-ss-{pid}-{}-{i}", session.id);
            if proxy.acquire_in(session, &resource).await?.is_none() {
                anyhow::bail!("{resource} was held already");
            }
            Ok(())
        }
    }))
    .buffer_unordered(in_flight.max(1));
    while let Some(r) = acquiring.next().await {
        r?;
    }
    Ok(())
}

/// Resources held under the sessions now, and how many sessions hold fewer than
/// `per_session` (or have ended).
async fn count_held(
    proxy: &Arc<Proxy>,
    all: &[<Proxy as SessionBackend>::Session],
    per_session: usize,
) -> anyhow::Result<(usize, usize)> {
    let mut counting =
        futures::stream::iter((0..all.len()).map(|i| proxy.session_resources(&all[i])))
            .buffer_unordered(32);
    let (mut held, mut short) = (0, 0);
    while let Some(n) = counting.next().await {
        let n = n?.unwrap_or(0);
        held += n;
        if n < per_session {
            short += 1;
        }
    }
    Ok((held, short))
}
