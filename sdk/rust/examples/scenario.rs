//! The scripted scenario every SDK runs (docs/SDKS.md), with this SDK, against a running stack —
//! lease-proxy, the warehouse inventory behind fence-gateway, etcd —: prints what the SDK let it
//! observe, one line per step: KEY, a tab, the observation. scripts/sdk-scenario.sh runs it
//! beside the other SDKs' runners and compares the lines.
//!
//! ```sh
//! cargo run -p lease-proxy-client --example scenario -- \
//!     --proxy URL --gateway URL --etcd URL --prefix rust-
//! ```

use std::sync::Arc;
use std::time::Duration;

use lease_proxy_client::{
    AcquireOptions, Client, Error, FleetSpec, JoinOptions, Lease, LostReason, Member,
};
use serde_json::json;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Each wait of the scenario is bounded by this.
const WITHIN: Duration = Duration::from_secs(5);
/// The fleet's drain deadline: a hand-off done in a quarter of it was the member's release.
const DRAIN: Duration = Duration::from_secs(20);

/// Why the scenario could not go on.
type Failure = Box<dyn std::error::Error + Send + Sync>;
type Outcome<T> = Result<T, Failure>;

fn say(key: &str, observed: &str) {
    println!("{key}\t{observed}");
}

fn compare(a: u64, b: u64) -> &'static str {
    match a.cmp(&b) {
        std::cmp::Ordering::Greater => "above",
        std::cmp::Ordering::Equal => "equal to",
        std::cmp::Ordering::Less => "below",
    }
}

/// A loss reason as the other SDKs spell it.
fn reason(reason: LostReason) -> &'static str {
    match reason {
        LostReason::Expired => "expired",
        LostReason::Revoked => "revoked",
        LostReason::SessionLost => "session-lost",
        LostReason::Released => "released",
        LostReason::HandedOff => "handed-off",
        _ => "unknown",
    }
}

/// Waits until `check` holds, at most [`WITHIN`].
async fn eventually(what: &str, check: impl Fn() -> bool) -> Outcome<()> {
    let deadline = Instant::now() + WITHIN;
    while !check() {
        if Instant::now() > deadline {
            return Err(format!("{what}: not within {WITHIN:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

struct Scenario {
    proxy: String,
    gateway: String,
    etcd: String,
    prefix: String,
    store: reqwest::Client,
}

impl Scenario {
    /// The outcome of a write under `lease`: its status (and the gateway's refusal), or the
    /// SDK's refusal to send.
    async fn outcome(
        &self,
        lease: &Lease,
        request: Result<reqwest::RequestBuilder, Error>,
    ) -> String {
        let sent = match request {
            Ok(request) => request.send().await.map_err(Error::from),
            Err(e) => Err(e),
        };
        match sent {
            Err(Error::Lost) => format!(
                "refused by the SDK, nothing sent: lost ({})",
                reason(lease.lost_reason().await)
            ),
            Err(e) => format!("error: {e}"),
            Ok(answer) => {
                let status = answer.status().as_u16();
                match answer
                    .headers()
                    .get("fencing-rejection")
                    .and_then(|v| v.to_str().ok())
                {
                    Some(rejection) => format!("{status} {rejection}"),
                    None => status.to_string(),
                }
            }
        }
    }

    /// The count write of `robot` to `lease`'s aisle.
    fn put(&self, lease: &Lease, robot: &str, n: u32) -> reqwest::RequestBuilder {
        self.store
            .put(format!(
                "{}/aisles/{}/count",
                self.gateway,
                lease.resource()
            ))
            .json(&json!({"robot": robot, "count": n}))
    }

    /// A count written through fence-gateway with `Lease::fence`, which adds the lease's token.
    async fn write(&self, lease: &Lease, robot: &str, n: u32) -> String {
        self.outcome(lease, lease.fence(self.put(lease, robot, n)))
            .await
    }

    /// A count written with `lease`'s token set by hand, as a holder that missed its loss would.
    async fn presented(&self, lease: &Lease, robot: &str, n: u32) -> String {
        let request = self
            .put(lease, robot, n)
            .header("fencing-token", lease.fencing_token())
            .header("fencing-resource", lease.resource());
        let sent = self.outcome(lease, Ok(request)).await;
        format!("token sent anyway: {sent}")
    }

    /// Revokes an etcd lease through etcd's JSON gateway: a lease lost to etcd.
    async fn revoke(&self, lease_id: &str) -> Outcome<()> {
        let answer = self
            .store
            .post(format!("{}/v3/lease/revoke", self.etcd))
            .json(&json!({"ID": lease_id}))
            .send()
            .await?;
        if answer.status() != reqwest::StatusCode::OK {
            return Err(format!("revoke {lease_id}: {}", answer.status()).into());
        }
        Ok(())
    }

    /// Acquire, renew, write through the gateway, a takeover after a forced loss, the old
    /// holder's write refused, release.
    async fn leases(&self) -> Outcome<()> {
        let (a, b) = (Client::new(&self.proxy)?, Client::new(&self.proxy)?);
        let aisle = format!("{}aisle", self.prefix);
        let ttl = Duration::from_secs(3);
        let old = a.acquire(&aisle, AcquireOptions::new("a", ttl)).await?;
        say("lease.acquire", &format!("acquired by {}", old.holder()));
        let first = old.deadline();
        eventually("a renewal moving the stop-by deadline on", || {
            old.deadline() > first
        })
        .await?;
        let held = if old.is_lost() {
            format!("lost ({})", reason(old.lost_reason().await))
        } else {
            "held".to_owned()
        };
        say(
            "lease.renew",
            &format!("renewed in the background: stop-by later, {held}"),
        );
        say("lease.write", &self.write(&old, "a", 1).await);
        self.revoke(old.lease_id()).await?;
        tokio::time::timeout(WITHIN, old.lost().cancelled())
            .await
            .map_err(|_| "the revoked lease was not reported lost")?;
        let why = reason(old.lost_reason().await);
        say("lease.revoke", &format!("a told: lost ({why})"));
        let newer = b
            .acquire(&aisle, AcquireOptions::new("b", ttl).wait(WITHIN))
            .await?;
        let above = compare(newer.token(), old.token());
        say(
            "lease.takeover",
            &format!("acquired by {}, token {above} a's", newer.holder()),
        );
        say("lease.new-write", &self.write(&newer, "b", 2).await);
        say("lease.old-write", &self.write(&old, "a", 3).await);
        say("lease.old-token", &self.presented(&old, "a", 4).await);
        let holder = newer.holder().to_owned();
        newer.release().await?;
        let free = match b.get(&aisle).await? {
            None => "the resource is free",
            Some(_) => "the resource is not free",
        };
        say("lease.release", &format!("released by {holder}: {free}"));
        Ok(())
    }

    /// A member receives, writes and hands off when a second one joins, drains; a member whose
    /// session ends is told.
    async fn fleet(&self) -> Outcome<()> {
        let client = Client::new(&self.proxy)?;
        let name = format!("{}fleet", self.prefix);
        let spec = FleetSpec::new([format!("{name}-1"), format!("{name}-2")]).drain(DRAIN);
        client.put_fleet(&name, &spec).await?;
        let join = |member: &str| {
            JoinOptions::new(member, Duration::from_secs(10)).poll(Duration::from_secs(2))
        };
        let mut w1 = Serving::start(client.join_fleet(&name, join("m1")).await?);
        let got = w1.started.take(2).await?;
        say(
            "fleet.join",
            &format!("m1 assigned {} resources", got.len()),
        );
        let first = self.write(&got[0], "m1", 1).await;
        let second = self.write(&got[1], "m1", 1).await;
        say("fleet.write", &format!("{first}; {second}"));

        let m2 = client.join_fleet(&name, join("m2")).await?;
        let joined = Instant::now();
        let mut w2 = Serving::start(m2);
        let moved = w1.ended.take_one().await?;
        let why = reason(moved.lost_reason().await);
        say(
            "fleet.second-join",
            &format!("m1's work on 1 resource ended: {why}"),
        );
        let taken = w2.started.take_one().await?;
        let took = joined.elapsed();
        let when = if taken.resource() != moved.resource() {
            "but another resource".to_owned()
        } else if took < DRAIN / 4 {
            "well within the drain deadline".to_owned()
        } else {
            format!(
                "after {} ms (the service's revocation, not the member's release)",
                took.as_millis()
            )
        };
        let above = compare(taken.token(), moved.token());
        say(
            "fleet.hand-off",
            &format!("m2 assigned the same resource, token {above} m1's, {when}"),
        );
        say("fleet.new-write", &self.write(&taken, "m2", 2).await);
        say("fleet.old-write", &self.write(&moved, "m1", 3).await);
        say("fleet.old-token", &self.presented(&moved, "m1", 4).await);

        w1.member.drain().await?;
        let drained = w1.ended.take_one().await?;
        let rest = w2.started.take_one().await?;
        let why = reason(drained.lost_reason().await);
        let same = rest.resource() == drained.resource();
        say(
            "fleet.drain",
            &format!("m1's work on 1 resource ended: {why}; m2 assigned it: {same}"),
        );

        let session = w2.member.session_id().ok_or("m2 has no session")?;
        self.revoke(&session).await?;
        let ended = w2.ended.take(2).await?;
        let lost = ended.iter().filter(|lease| lease.is_lost()).count();
        let served = tokio::time::timeout(WITHIN, w2.task)
            .await
            .map_err(|_| "m2's serve did not end after its session ended")??;
        let ended_as = match &served {
            Err(Error::SessionLost) => "session lost".to_owned(),
            Err(e) if e.slug() == Some("no-member") => "session lost".to_owned(),
            other => format!("{other:?}"),
        };
        say(
            "fleet.session-end",
            &format!("m2's work on {lost} resources ended: lost; the member ended: {ended_as}"),
        );
        w1.leave().await?;
        client.delete_fleet(&name).await?;
        Ok(())
    }
}

/// The leases a member's work starts or ends with, in order.
struct Mailbox(mpsc::UnboundedReceiver<Arc<Lease>>);

impl Mailbox {
    /// The next `n` within the scenario's bound, sorted by resource.
    async fn take(&mut self, n: usize) -> Outcome<Vec<Arc<Lease>>> {
        let deadline = Instant::now() + WITHIN;
        let mut got = Vec::with_capacity(n);
        for _ in 0..n {
            match tokio::time::timeout_at(deadline, self.0.recv()).await {
                Ok(Some(lease)) => got.push(lease),
                _ => return Err(format!("{n} leases: not within {WITHIN:?}").into()),
            }
        }
        got.sort_by(|a, b| a.resource().cmp(b.resource()));
        Ok(got)
    }

    async fn take_one(&mut self) -> Outcome<Arc<Lease>> {
        let mut one = self.take(1).await?;
        one.pop().ok_or_else(|| "no lease".into())
    }
}

/// `Member::serve` in a task, with work that reports its start and end and waits for its
/// lease's loss.
struct Serving {
    member: Arc<Member>,
    started: Mailbox,
    ended: Mailbox,
    leave: CancellationToken,
    /// What `serve` returned (`Ok` too once left).
    task: JoinHandle<lease_proxy_client::Result<()>>,
}

impl Serving {
    fn start(member: Member) -> Serving {
        let member = Arc::new(member);
        let (started, started_rx) = mpsc::unbounded_channel();
        let (ended, ended_rx) = mpsc::unbounded_channel();
        let leave = CancellationToken::new();
        let task = tokio::spawn({
            let (member, leave) = (member.clone(), leave.clone());
            async move {
                let work = move |lease: Lease| {
                    let lease = Arc::new(lease);
                    let (started, ended) = (started.clone(), ended.clone());
                    async move {
                        let lost = lease.lost();
                        let _ = started.send(lease.clone());
                        lost.cancelled().await;
                        let _ = ended.send(lease);
                    }
                };
                let served = tokio::select! {
                    served = member.serve(work) => return served,
                    _ = leave.cancelled() => Ok(()),
                };
                // Left: the one handle left is this task's.
                match Arc::try_unwrap(member) {
                    Ok(member) => member.leave().await,
                    Err(_) => served,
                }
            }
        });
        Serving {
            member,
            started: Mailbox(started_rx),
            ended: Mailbox(ended_rx),
            leave,
            task,
        }
    }

    /// Leaves the fleet and waits for the serving task.
    async fn leave(self) -> Outcome<()> {
        drop(self.member);
        self.leave.cancel();
        tokio::time::timeout(WITHIN, self.task)
            .await
            .map_err(|_| "the member did not leave")???;
        Ok(())
    }
}

/// `--name value` pairs of the command line.
fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .cloned()
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let (Some(proxy), Some(gateway), Some(etcd)) = (
        arg(&args, "--proxy"),
        arg(&args, "--gateway"),
        arg(&args, "--etcd"),
    ) else {
        eprintln!("usage: scenario --proxy URL --gateway URL --etcd URL [--prefix NAME-]");
        return std::process::ExitCode::from(64);
    };
    let scenario = Scenario {
        proxy,
        gateway,
        etcd,
        prefix: arg(&args, "--prefix").unwrap_or_else(|| "rust-".to_owned()),
        store: reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap_or_default(),
    };
    let run = async {
        scenario.leases().await?;
        scenario.fleet().await
    };
    match run.await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            say("failed", &e.to_string());
            std::process::ExitCode::FAILURE
        }
    }
}
