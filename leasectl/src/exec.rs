//! `leasectl exec`: wait for the lease, run the command while the SDK's guard renews it, stop
//! the command when the lease is lost, release the lease when the command exits.

use std::time::Duration;

use lease_proxy_client::{AcquireOptions, Client, Error as ClientError, Lease};
use nix::sys::signal::Signal;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::cli::{default_holder, Exec, EXIT_LOST};
use crate::error::Error;
use crate::supervise::{exit_code, spawn, supervise, Stopped};

/// The longest server-side wait one acquire asks for; a longer `--wait` (or none: forever)
/// asks again. Within the proxy's default `--max-wait` (60 s); a proxy with a shorter one says
/// so and is then asked for that.
const WAIT_CHUNK: Duration = Duration::from_secs(30);

/// Runs `exec` and returns leasectl's exit status.
pub(crate) async fn run(client: &Client, exec: Exec) -> Result<u8, Error> {
    let mut signals = crate::signals::catch()?;
    let holder = exec.holder.clone().unwrap_or_else(default_holder);
    let lease = tokio::select! {
        lease = acquire(client, &exec, holder) => lease?,
        Some(signal) = signals.recv() => {
            eprintln!("leasectl: {signal} while waiting for {}", exec.resource);
            return Ok(128 + signal_number(signal));
        }
    };
    if lease.is_lost() {
        eprintln!(
            "leasectl: the lease on {} was lost before the command started",
            exec.resource
        );
        // Lost on our side only (its deadline passed): give it back rather than let it expire.
        let _ = lease.release().await;
        return Ok(EXIT_LOST);
    }
    let ended = run_command(&exec, &lease, &mut signals).await;
    let reason = if lease.is_lost() {
        Some(lease.lost_reason().await)
    } else {
        None
    };
    let released = lease.release().await;
    let outcome = ended?;
    if let Some(stopped) = outcome.lost {
        let how = match stopped {
            Stopped::Terminated => "ended after SIGTERM",
            Stopped::Killed => "was killed after the grace period",
        };
        eprintln!(
            "leasectl: the lease on {} was lost ({}); the command {how} (status {})",
            exec.resource,
            reason.map_or_else(|| "unknown".to_owned(), |r| format!("{r:?}").to_lowercase()),
            exit_code(outcome.status)
        );
        return Ok(EXIT_LOST);
    }
    if let Err(e) = released {
        eprintln!(
            "leasectl: cannot release {} (it expires after its TTL): {e}",
            exec.resource
        );
    }
    Ok(exit_code(outcome.status))
}

/// Starts the command with the lease in its environment and supervises it.
async fn run_command(
    exec: &Exec,
    lease: &Lease,
    signals: &mut mpsc::Receiver<Signal>,
) -> Result<crate::supervise::Outcome, Error> {
    let env = [
        ("FENCING_TOKEN", lease.fencing_token().to_owned()),
        ("FENCING_RESOURCE", lease.resource().to_owned()),
        ("LEASE_TOKEN", lease.token().to_string()),
        ("LEASE_ID", lease.lease_id().to_owned()),
    ];
    let (program, args) = exec
        .command
        .split_first()
        .ok_or_else(|| Error::Usage("no command to run".to_owned()))?;
    let mut child = spawn(program, args, &env)?;
    supervise(&mut child, lease.lost(), exec.grace, signals).await
}

/// Acquires the lease, asking again while it is held until `--wait` runs out. Each acquire
/// waits server-side for up to [`WAIT_CHUNK`], or the proxy's `--max-wait` once it said that is
/// shorter.
async fn acquire(client: &Client, exec: &Exec, holder: String) -> Result<Lease, Error> {
    let until = exec.wait.map(|wait| Instant::now() + wait);
    let mut most = WAIT_CHUNK;
    loop {
        let chunk = until.map_or(most, |until| {
            until.saturating_duration_since(Instant::now()).min(most)
        });
        let mut opts = AcquireOptions::new(holder.clone(), Duration::from_secs(exec.ttl));
        if !chunk.is_zero() {
            opts = opts.wait(chunk);
        }
        match client.acquire(&exec.resource, opts).await {
            Err(ClientError::Held { .. }) if until.is_none_or(|until| Instant::now() < until) => {}
            Err(e) => match proxy_max_wait(&e) {
                Some(max) if max < chunk => most = max,
                _ => return Err(e.into()),
            },
            Ok(lease) => return Ok(lease),
        }
    }
}

/// The proxy's `--max-wait` when `e` refused a `wait_ms` over it (400 `invalid-field`, detail
/// `wait_ms: must be at most N`).
fn proxy_max_wait(e: &ClientError) -> Option<Duration> {
    match e {
        ClientError::Problem {
            status: 400,
            detail,
            ..
        } if e.slug() == Some("invalid-field") => detail
            .strip_prefix("wait_ms: must be at most ")?
            .trim()
            .parse()
            .ok()
            .map(Duration::from_millis),
        _ => None,
    }
}

/// The number of `signal`, for the 128+N exit status.
fn signal_number(signal: Signal) -> u8 {
    u8::try_from(signal as i32).unwrap_or(0)
}
