//! The command line: global connection flags, the subcommands, the exit statuses, and the
//! completions and man page generated from this definition.

use std::ffi::OsString;
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, CommandFactory, Parser, Subcommand};
use clap_complete::Shell;

/// EX_USAGE: the command line is wrong.
pub(crate) const EXIT_USAGE: u8 = 64;
/// The proxy could not be reached or refused the request (other than the statuses below).
pub(crate) const EXIT_UNAVAILABLE: u8 = 69;
/// EX_SOFTWARE: leasectl itself failed (signals, waiting for the command, writing its output).
pub(crate) const EXIT_INTERNAL: u8 = 70;
/// EX_TEMPFAIL: the resource is held by someone else (and `--wait` ran out).
pub(crate) const EXIT_HELD: u8 = 75;
/// The lease was lost: a `renew` answered 410, or `exec`'s lease ended while the command ran.
pub(crate) const EXIT_LOST: u8 = 76;
/// `get`: the resource is free (`fleet show`: there is no such fleet).
pub(crate) const EXIT_FREE: u8 = 1;
/// `exec`: the command was found but could not be started.
pub(crate) const EXIT_CANNOT_EXECUTE: u8 = 126;
/// `exec`: the command was not found.
pub(crate) const EXIT_NOT_FOUND: u8 = 127;

const EXIT_STATUSES: &str = "\
Exit status:
  0      success (exec: the command's own status)
  1      get: the resource is free; fleet show: there is no such fleet
  64     the command line is wrong
  69     the proxy could not be reached, or answered an error not listed here
  70     leasectl itself failed (signals, waiting for the command, writing its output)
  75     the resource is held by someone else (exec: and --wait ran out)
  76     the lease was lost (renew: 410; exec: the lease ended while the command ran, which was
         sent SIGTERM, then SIGKILL after --grace; fleet join: the member's session ended, or it
         was evicted)
  126    exec: the command could not be started
  127    exec: the command was not found
  128+N  exec: the command was killed by signal N (or leasectl got signal N while waiting for
         the lease, before the command started)
  other  exec: the command's exit status";

/// Command-line client of lease-proxy.
#[derive(Debug, Parser)]
#[command(name = "leasectl", version, after_long_help = EXIT_STATUSES, subcommand_required = false, arg_required_else_help = true)]
pub(crate) struct Cli {
    /// How to reach the proxy.
    #[command(flatten)]
    pub(crate) connection: Connection,

    /// Print something generated and exit.
    #[command(flatten)]
    pub(crate) print: PrintAndExit,

    /// What to do.
    #[command(subcommand)]
    pub(crate) command: Option<Command>,
}

/// How to reach the proxy.
#[derive(Debug, Args)]
pub(crate) struct Connection {
    /// Base URL of lease-proxy.
    #[arg(
        long,
        global = true,
        env = "LEASECTL_URL",
        default_value = "http://127.0.0.1:7070"
    )]
    pub(crate) url: String,

    /// Bearer token sent in `Authorization` (when the proxy runs with --auth-tokens).
    #[arg(long, global = true, env = "LEASECTL_TOKEN", hide_env_values = true)]
    pub(crate) token: Option<String>,

    /// PEM file of the CAs to trust for an https:// URL (instead of the system's).
    #[arg(long, global = true, env = "LEASECTL_CA_FILE", value_name = "FILE")]
    pub(crate) ca_file: Option<PathBuf>,

    /// PEM client certificate (chain) for mTLS; needs --key.
    #[arg(
        long,
        global = true,
        env = "LEASECTL_CERT",
        value_name = "FILE",
        requires = "key"
    )]
    pub(crate) cert: Option<PathBuf>,

    /// PEM private key of --cert.
    #[arg(
        long,
        global = true,
        env = "LEASECTL_KEY",
        value_name = "FILE",
        requires = "cert"
    )]
    pub(crate) key: Option<PathBuf>,

    /// Timeout of each HTTP request (a waiting acquire gets its wait on top).
    #[arg(long, global = true, env = "LEASECTL_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    pub(crate) timeout: Duration,
}

/// Flags that make leasectl print something and exit.
#[derive(Debug, Args)]
pub(crate) struct PrintAndExit {
    /// Print shell completions for SHELL and exit.
    #[arg(long, value_name = "SHELL", value_enum)]
    pub(crate) completions: Option<Shell>,

    /// Print the man page (roff) and exit.
    #[arg(long)]
    pub(crate) man: bool,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Acquire RESOURCE once (not renewed) and print the grant as JSON (its `secret` renews
    /// and releases it).
    Acquire {
        /// The resource.
        resource: String,
        /// Time to live of the grant, in seconds.
        #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..))]
        ttl: u64,
        /// Holder name (default: HOSTNAME:PID).
        #[arg(long)]
        holder: Option<String>,
        /// Wait this long (at most the proxy's --max-wait) for a held resource.
        #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
        wait: Option<Duration>,
        /// Idempotency-Key: retrying with the same key returns the same grant.
        #[arg(long, value_name = "KEY")]
        idempotency_key: Option<String>,
    },
    /// Renew a grant and print the answer as JSON.
    Renew {
        /// The resource.
        resource: String,
        /// The grant's secret.
        #[arg(long, env = "LEASE_SECRET", hide_env_values = true)]
        secret: String,
    },
    /// Release a grant (idempotent).
    Release {
        /// The resource.
        resource: String,
        /// The grant's secret.
        #[arg(long, env = "LEASE_SECRET", hide_env_values = true)]
        secret: String,
    },
    /// Print who holds RESOURCE as JSON (exit 1 when it is free).
    Get {
        /// The resource.
        resource: String,
    },
    /// Print the held resources as JSON lines, in name order.
    List {
        /// Only resources whose name starts with this.
        #[arg(long, default_value = "")]
        prefix: String,
    },
    /// Print lease events (acquired, released, expired) as JSON lines until interrupted.
    Watch {
        /// Only resources whose name starts with this.
        #[arg(long, default_value = "")]
        prefix: String,
        /// Resume after this event id (the `id` of the last event seen).
        #[arg(long, value_name = "ID")]
        last_event_id: Option<String>,
    },
    /// Wait for a lease on a resource, run a command while holding it, release it when the
    /// command exits.
    ///
    /// The command gets FENCING_TOKEN (signed, for the Fencing-Token header), FENCING_RESOURCE,
    /// LEASE_TOKEN (the grant's revision) and LEASE_ID in its environment, runs in a process
    /// group of its own, and receives the SIGINT, SIGTERM and SIGHUP sent to leasectl. The
    /// lease is renewed in the background; the moment it is lost the command's process group is
    /// sent SIGTERM, and SIGKILL if it still runs after --grace. leasectl releases the lease when
    /// the command exits and exits with its status (128+N when signal N killed it), or 76 when
    /// the lease was lost.
    #[command(after_long_help = EXIT_STATUSES)]
    Exec(Exec),
    /// Fleets: make, show or delete one, join one as a member, drain or evict a member.
    #[command(subcommand)]
    Fleet(FleetCommand),
}

/// `leasectl fleet …`.
#[derive(Debug, Subcommand)]
pub(crate) enum FleetCommand {
    /// Make or change FLEET, shared among its members, and print it as written (JSON).
    Set {
        /// The fleet.
        fleet: String,
        /// Its resources (all of them: the list replaces the fleet's).
        #[arg(required = true, value_name = "RESOURCE")]
        resources: Vec<String>,
        /// How long a member has to release a resource moved away from it before the service
        /// revokes it (default: the service's, 5s).
        #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
        drain: Option<Duration>,
        /// The most hand-offs in flight at once (default: the service's).
        #[arg(long, value_name = "N")]
        max_moves: Option<u32>,
    },
    /// Print FLEET as it stands (JSON: members, what each holds and hands off, what nobody
    /// holds); exit 1 when there is no such fleet.
    Show {
        /// The fleet.
        fleet: String,
    },
    /// End FLEET: its members' grants of its resources are released (idempotent).
    Delete {
        /// The fleet.
        fleet: String,
    },
    /// Join FLEET as a member and print its assignment's changes as JSON lines until SIGINT,
    /// SIGTERM or SIGHUP, then leave.
    ///
    /// The first line is `{fleet, member, session_id}`; then one line per change: `revision`,
    /// `state`, `held` (every resource held and assigned), `added` (resource, token,
    /// fencing_token, lease_id of each new grant), `releasing` (resource, token, deadline_ms of
    /// each resource moved to another member: leasectl releases it at once), `removed`,
    /// `rejoined`. The session is kept alive at a third of --ttl. Exit 0 after leaving on a
    /// signal, 76 when the member ended otherwise (its session lost without --rejoin, or
    /// evicted).
    #[command(after_long_help = EXIT_STATUSES)]
    Join(FleetJoin),
    /// Drain MEMBER of FLEET as an operator: it hands everything off and is given nothing new.
    Drain {
        /// The fleet.
        fleet: String,
        /// The member.
        member: String,
    },
    /// Evict MEMBER of FLEET (an operator): its grants end at once.
    Evict {
        /// The fleet.
        fleet: String,
        /// The member.
        member: String,
    },
}

/// `leasectl fleet join`.
#[derive(Debug, Args)]
pub(crate) struct FleetJoin {
    /// The fleet.
    pub(crate) fleet: String,
    /// The member's name (the resource grammar; default: HOSTNAME:PID).
    #[arg(long, default_value_t = default_member())]
    pub(crate) member: String,
    /// Time to live of the member's session, in seconds.
    #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) ttl: u64,
    /// Its share's weight, 1 to 1000.
    #[arg(long, value_name = "N")]
    pub(crate) weight: Option<u32>,
    /// Join again under the same name when the session ends, instead of exiting 76.
    #[arg(long)]
    pub(crate) rejoin: bool,
    /// How long one long poll of the assignment waits (at most the proxy's --max-wait).
    #[arg(long, value_name = "DURATION", default_value = "20s", value_parser = humantime::parse_duration)]
    pub(crate) poll: Duration,
}

/// `leasectl exec`.
#[derive(Debug, Args)]
pub(crate) struct Exec {
    /// The resource to hold while the command runs.
    #[arg(long)]
    pub(crate) resource: String,
    /// Time to live of the lease, in seconds (renewed every third of it).
    #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) ttl: u64,
    /// Holder name (default: HOSTNAME:PID).
    #[arg(long)]
    pub(crate) holder: Option<String>,
    /// Give up (exit 75) when the resource is still held after this long (default: wait forever).
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub(crate) wait: Option<Duration>,
    /// How long the command has to exit after SIGTERM when the lease is lost, before SIGKILL.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = humantime::parse_duration)]
    pub(crate) grace: Duration,
    /// The command and its arguments.
    #[arg(required = true, last = true, value_name = "CMD")]
    pub(crate) command: Vec<OsString>,
}

/// Writes the completions for `shell`, or the man page, to `out`; `false` when neither was asked
/// for.
pub(crate) fn write_generated(asked: &PrintAndExit, out: &mut dyn Write) -> std::io::Result<bool> {
    let mut cmd = Cli::command();
    if let Some(shell) = asked.completions {
        clap_complete::generate(shell, &mut cmd, "leasectl", out);
        return Ok(true);
    }
    if asked.man {
        clap_mangen::Man::new(cmd).render(out)?;
        return Ok(true);
    }
    Ok(false)
}

/// The default member name: `HOSTNAME:PID`, any character the resource grammar has no room for
/// (anything but letters, digits and `._:-`) as `-`.
pub(crate) fn default_member() -> String {
    default_holder()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._:-".contains(c) {
                c
            } else {
                '-'
            }
        })
        .collect()
}

/// The default holder name: `HOSTNAME:PID`.
pub(crate) fn default_holder() -> String {
    let host = nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_owned());
    format!("{host}:{}", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn exec_takes_the_command_after_the_double_dash() {
        let cli = Cli::try_parse_from([
            "leasectl",
            "exec",
            "--resource",
            "r",
            "--ttl",
            "5",
            "--",
            "sh",
            "-c",
            "exit 3",
        ])
        .unwrap();
        let Some(Command::Exec(exec)) = cli.command else {
            panic!("not exec: {cli:?}");
        };
        assert_eq!(exec.command, ["sh", "-c", "exit 3"]);
        assert_eq!(exec.grace, Duration::from_secs(10));
        assert_eq!(exec.wait, None, "waits forever by default");
        assert!(
            Cli::try_parse_from(["leasectl", "exec", "--resource", "r", "--ttl", "5"]).is_err()
        );
        assert!(Cli::try_parse_from([
            "leasectl",
            "exec",
            "--resource",
            "r",
            "--ttl",
            "0",
            "--",
            "true"
        ])
        .is_err());
    }

    #[test]
    fn help_and_man_page_document_the_exit_statuses() {
        let help = Cli::command().render_long_help().to_string();
        assert!(help.contains("76     the lease was lost"), "{help}");
        let mut man = Vec::new();
        let asked = PrintAndExit {
            completions: None,
            man: true,
        };
        assert!(write_generated(&asked, &mut man).unwrap());
        assert!(String::from_utf8_lossy(&man).contains("the lease was lost"));
        let mut bash = Vec::new();
        let asked = PrintAndExit {
            completions: Some(Shell::Bash),
            man: false,
        };
        assert!(write_generated(&asked, &mut bash).unwrap());
        assert!(String::from_utf8_lossy(&bash).contains("--grace"));
    }

    #[test]
    fn the_default_holder_names_this_process() {
        assert!(default_holder().ends_with(&format!(":{}", std::process::id())));
    }
}
