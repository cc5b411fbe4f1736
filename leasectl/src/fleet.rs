//! `leasectl fleet`: make, show, delete a fleet, drain or evict a member (one call each, the
//! answer printed as JSON), and `join`, which stays a member and prints its assignment's
//! changes as they happen.

use std::collections::HashMap;
use std::time::Duration;

use futures::StreamExt;
use lease_proxy_client::{
    AssignmentChange, Client, Error as ClientError, FleetSpec, JoinOptions, Lease, Member,
    MemberState,
};
use serde::Serialize;
use serde_json::json;
use tokio::time::Instant;

use crate::cli::{FleetCommand, FleetJoin, EXIT_FREE, EXIT_LOST};
use crate::error::Error;
use crate::oneshot::print_line;

/// Runs one `leasectl fleet` subcommand; leasectl's exit status.
pub(crate) async fn run(client: &Client, command: FleetCommand) -> Result<u8, Error> {
    match command {
        FleetCommand::Set {
            fleet,
            resources,
            drain,
            max_moves,
        } => {
            let mut spec = FleetSpec::new(resources);
            spec.drain = drain;
            spec.max_moves = max_moves;
            print_line(&client.put_fleet(&fleet, &spec).await?)?;
            Ok(0)
        }
        FleetCommand::Show { fleet } => match client.get_fleet(&fleet).await? {
            Some(view) => {
                print_line(&view)?;
                Ok(0)
            }
            None => {
                eprintln!("leasectl: there is no fleet {fleet}");
                Ok(EXIT_FREE)
            }
        },
        FleetCommand::Delete { fleet } => {
            client.delete_fleet(&fleet).await?;
            Ok(0)
        }
        FleetCommand::Drain { fleet, member } => {
            let state = client.drain_member(&fleet, &member).await?;
            print_line(&json!({"fleet": fleet, "member": member, "state": state}))?;
            Ok(0)
        }
        FleetCommand::Evict { fleet, member } => {
            client.evict_member(&fleet, &member).await?;
            Ok(0)
        }
        FleetCommand::Join(join) => self::join(client, join).await,
    }
}

/// The first line `join` prints: who it joined as.
#[derive(Serialize)]
struct Joined<'a> {
    fleet: &'a str,
    member: &'a str,
    session_id: String,
}

/// One change, as `join` prints it.
#[derive(Serialize)]
struct ChangeLine<'a> {
    /// Decimal string, as the API writes revisions.
    revision: String,
    state: MemberState,
    held: &'a [String],
    added: Vec<AddedLine>,
    releasing: Vec<ReleasingLine>,
    removed: &'a [String],
    rejoined: bool,
}

#[derive(Serialize)]
struct AddedLine {
    resource: String,
    token: String,
    fencing_token: String,
    lease_id: String,
}

#[derive(Serialize)]
struct ReleasingLine {
    resource: String,
    token: String,
    /// Milliseconds left, from when the line was printed, to finish and release it by.
    deadline_ms: u64,
}

fn line(change: &AssignmentChange) -> ChangeLine<'_> {
    let now = Instant::now();
    ChangeLine {
        revision: change.revision.to_string(),
        state: change.state,
        held: &change.held,
        added: change
            .added
            .iter()
            .map(|l| AddedLine {
                resource: l.resource().to_owned(),
                token: l.token().to_string(),
                fencing_token: l.fencing_token().to_owned(),
                lease_id: l.lease_id().to_owned(),
            })
            .collect(),
        releasing: change
            .releasing
            .iter()
            .map(|r| ReleasingLine {
                resource: r.resource().to_owned(),
                token: r.token().to_string(),
                deadline_ms: millis(r.deadline().saturating_duration_since(now)),
            })
            .collect(),
        removed: &change.removed,
        rejoined: change.rejoined,
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// `leasectl fleet join`: joins, prints each change of the assignment as a JSON line (the
/// first line says who joined), gives back at once what is moved away (leasectl has no work to
/// finish), keeps the session alive, and leaves on SIGINT, SIGTERM or SIGHUP (exit 0). Exits 76
/// when the member ends without being asked to (its session lost, evicted), or with the
/// error's status.
async fn join(client: &Client, join: FleetJoin) -> Result<u8, Error> {
    let mut signals = crate::signals::catch()?;
    let mut opts = JoinOptions::new(join.member.clone(), Duration::from_secs(join.ttl))
        .rejoin(join.rejoin)
        .poll(join.poll);
    opts.weight = join.weight;
    let member = tokio::select! {
        member = client.join_fleet(&join.fleet, opts) => member?,
        Some(_) = signals.recv() => return Ok(0),
    };
    print_line(&Joined {
        fleet: &join.fleet,
        member: &join.member,
        session_id: member.session_id().unwrap_or_default(),
    })?;
    let outcome = tokio::select! {
        outcome = follow(&member) => outcome,
        Some(signal) = signals.recv() => {
            eprintln!("leasectl: {signal}: leaving fleet {}", join.fleet);
            Ok(0)
        }
    };
    let left = member.leave().await;
    let code = outcome?;
    if let Err(e) = left {
        if code == 0 {
            eprintln!(
                "leasectl: leaving {} (its session lapses at its TTL): {e}",
                join.fleet
            );
        }
    }
    Ok(code)
}

/// Prints the member's changes until it ends; the exit status then. Holds each granted
/// resource's guard while it is assigned, and releases what is moved away at once.
async fn follow(member: &Member) -> Result<u8, Error> {
    let mut guards: HashMap<String, Lease> = HashMap::new();
    let mut changes = member.assignments();
    while let Some(change) = changes.next().await {
        let mut change = match change {
            Ok(change) => change,
            Err(e) => return ended(member, e),
        };
        print_line(&line(&change))?;
        for lease in std::mem::take(&mut change.added) {
            guards.insert(lease.resource().to_owned(), lease);
        }
        for moved in &change.releasing {
            guards.remove(moved.resource());
            if let Err(e) = moved.release().await {
                eprintln!(
                    "leasectl: cannot release {} (the service revokes it at its deadline): {e}",
                    moved.resource()
                );
            }
        }
        for gone in &change.removed {
            guards.remove(gone);
        }
        if change.state == MemberState::Evicted {
            eprintln!(
                "leasectl: {} was evicted from {}",
                member.name(),
                member.fleet()
            );
            return Ok(EXIT_LOST);
        }
    }
    Ok(0)
}

/// The member ended with `e` (printed here): a lost session is a lost lease (76), anything
/// else the error's own status.
fn ended(member: &Member, e: ClientError) -> Result<u8, Error> {
    eprintln!(
        "leasectl: member {} of {}: {e}",
        member.name(),
        member.fleet()
    );
    if matches!(e, ClientError::SessionLost) || e.slug() == Some("no-member") {
        return Ok(EXIT_LOST);
    }
    Ok(Error::from(e).exit_code())
}
