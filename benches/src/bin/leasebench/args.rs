//! leasebench's command line.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

use super::ops::Op;

#[derive(Parser)]
#[command(about = "Lease throughput through lease-proxy vs raw etcd, side by side")]
pub(crate) struct Args {
    #[command(subcommand)]
    pub(crate) role: Option<Role>,
    /// etcd client URL (the one the proxy uses); starts its own etcd and proxy when absent.
    #[arg(long, requires = "proxy")]
    pub(crate) etcd: Option<String>,
    /// lease-proxy base URL.
    #[arg(long, requires = "etcd")]
    pub(crate) proxy: Option<String>,
    /// Pid of the proxy given with `--proxy`, to report its memory.
    #[arg(long)]
    pub(crate) proxy_pid: Option<u32>,
    /// Closed-loop operations to measure.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "acquire,contended,release,cycle,renew"
    )]
    pub(crate) op: Vec<Op>,
    /// Requests in flight, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,8,64,256")]
    pub(crate) concurrency: Vec<usize>,
    /// Operations per backend per cell.
    #[arg(long, default_value_t = 2000)]
    pub(crate) ops: usize,
    /// Rounds; backends alternate within each round.
    #[arg(long, default_value_t = 2)]
    pub(crate) rounds: usize,
    /// Leases held for the closed-loop `renew` and `get` measurements; also the sessions kept
    /// alive by `session-keepalive` (whose raw side renews as many held leases).
    #[arg(long, default_value_t = 1000)]
    pub(crate) held: usize,
    /// Renewals per `cycle`.
    #[arg(long, default_value_t = 3)]
    pub(crate) renewals: usize,
    /// Sustained renewal: numbers of held leases to run, comma-separated (none by default).
    #[arg(long, value_delimiter = ',')]
    pub(crate) sustain: Vec<usize>,
    /// How long each sustained run lasts.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub(crate) sustain_for: Duration,
    /// TTL the sustained renewal load stands for, in seconds: each lease is renewed every TTL/3
    /// (the leases themselves are held with a longer TTL so that setup time does not matter).
    #[arg(long, default_value_t = 30)]
    pub(crate) sustain_ttl: u64,
    /// Sustained runs per backend, interleaved: round k runs the proxy first when k is even
    /// and raw etcd's multiplexed stream first when it is odd (one stream per lease once,
    /// after the rounds), so neither side always runs on the fresher etcd.
    #[arg(long, default_value_t = 1)]
    pub(crate) sustain_rounds: usize,
    /// Most renewals outstanding at once in a sustained run.
    #[arg(long, default_value_t = 1024)]
    pub(crate) sustain_in_flight: usize,
    /// Largest sustained run that also measures one keepalive stream per lease.
    #[arg(long, default_value_t = 10_000)]
    pub(crate) per_lease_max: usize,
    /// Also write the results as JSON to this file.
    #[arg(long)]
    pub(crate) json: Option<PathBuf>,
    /// Also draw the closed-loop results as an SVG chart to this file.
    #[arg(long)]
    pub(crate) chart: Option<PathBuf>,
    /// Also measure a second proxy started with `--batch-max 1` (no group commit) beside the
    /// default one, for `acquire` and `session-acquire`.
    #[arg(long)]
    pub(crate) unbatched: bool,
    /// `--batch-in-flight` of the `--unbatched` proxy (the proxy's default, 4, when absent): with
    /// `--batch-max 1` it caps the ownership transactions with etcd at once.
    #[arg(long, requires = "unbatched")]
    pub(crate) unbatched_in_flight: Option<usize>,
    /// Also measure the proxy over cleartext HTTP/2 with prior knowledge (h2c), every request a
    /// stream on one connection, beside HTTP/1.1.
    #[arg(long)]
    pub(crate) h2c: bool,
    /// Sustained sessions: open this many sessions with the TTL `--sustain-ttl`, acquire
    /// `--per-session` resources under each while heartbeating every TTL/3, heartbeat for
    /// `--sustain-for`, then check every resource is still held.
    #[arg(long)]
    pub(crate) sustain_sessions: Option<usize>,
    /// Resources held under each session of `--sustain-sessions`.
    #[arg(long, default_value_t = 100)]
    pub(crate) per_session: usize,
    /// Measure the cost of security instead: a plain proxy (HTTP, no authentication) against
    /// one with HTTPS and bearer-token authentication, both started here on the same etcd.
    #[arg(long, conflicts_with_all = ["etcd", "proxy", "sustain"])]
    pub(crate) secure: bool,
    /// Also open this many gRPC watch streams on one prefix, through the proxy and straight to
    /// etcd, and report etcd's watchers, both processes' memory and the delivery of a put to
    /// all of them (the proxy started here gets `--max-watch-streams` to match).
    #[arg(long)]
    pub(crate) grpc_watchers: Option<usize>,
    /// Clients (HTTP/2 connections) the `--grpc-watchers` streams are spread over; the proxy
    /// serves at most 200 streams on one connection.
    #[arg(long, default_value_t = 10)]
    pub(crate) grpc_watch_channels: usize,
    /// Puts under the watched prefix, one at a time, each timed to every watcher.
    #[arg(long, default_value_t = 5)]
    pub(crate) grpc_watch_puts: usize,
    /// Hold this many idle `GET /v1/watch` streams open on the proxy while the tables run, and
    /// report etcd's watchers and the proxy's memory with them (the proxy started here gets
    /// `--max-watch-streams` and `--max-client-connections` to match).
    #[arg(long)]
    pub(crate) v1_watchers: Option<usize>,

    /// Hold this many watches of every key straight to etcd while the tables run (compare the
    /// rows' CPU per operation with a run without them: what a watch's fan-out costs etcd).
    #[arg(long)]
    pub(crate) etcd_watchers: Option<usize>,

    /// `--worker-threads` of the proxy started here (default: the proxy's own, one per CPU).
    #[arg(long)]
    pub(crate) proxy_worker_threads: Option<usize>,

    /// Do not bring etcd's read buffer to the same state before each timed loop (see
    /// `settle`): each side's loop then pays for what its own setup wrote last.
    #[arg(long)]
    pub(crate) no_settle: bool,

    /// Measure fleets instead (see `fleet`): each RESOURCESxMEMBERS (`100x10,10000x200`)
    /// through a lease-proxy fleet and as KCL 2.x's lease taker on raw etcd, `--rounds`
    /// rounds: a start, a join, a leave and a death, each timed to full coverage and to
    /// balance, with its moves and etcd writes.
    #[arg(long, value_delimiter = ',', value_parser = parse_fleet)]
    pub(crate) fleet: Vec<(usize, usize)>,

    /// The fleet members' TTL, seconds (a death is noticed after it).
    #[arg(long, default_value_t = 10)]
    pub(crate) fleet_ttl: u64,

    /// Also measure the peers a user would pick instead (see `peers`): etcd's grpc-proxy and a
    /// bare pass-through beside the proxy for the gRPC operations, etcd's JSON gateway and the
    /// proxy's `/v3` beside `/v1` for the HTTP ones; the peer is each table's first column.
    #[arg(long, conflicts_with_all = ["etcd", "proxy"])]
    pub(crate) peers: bool,

    /// The `etcd` binary whose `grpc-proxy` `--peers` starts.
    #[arg(long, default_value = "etcd")]
    pub(crate) etcd_bin: PathBuf,

    /// Most time a side's timed loop may take in one round: a loop still running then is cut,
    /// its row marked "(cut)" and figured over what it did by then (a peer that answers slowly
    /// cannot hang the run).
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    pub(crate) round_deadline: Duration,
}

/// Helper processes leasebench starts from its own binary.
#[derive(clap::Subcommand)]
pub(crate) enum Role {
    /// The bare pass-through (see `peers`): forwards every request to `upstream` over HTTP/2.
    #[command(hide = true)]
    PassThrough {
        #[arg(long)]
        listen: std::net::SocketAddr,
        #[arg(long)]
        upstream: String,
    },
}

/// `RESOURCESxMEMBERS`.
fn parse_fleet(s: &str) -> Result<(usize, usize), String> {
    let (r, m) = s
        .split_once('x')
        .ok_or_else(|| format!("`{s}`: expected RESOURCESxMEMBERS, e.g. 100x10"))?;
    let n = |v: &str| v.parse::<usize>().map_err(|e| format!("`{v}`: {e}"));
    let (r, m) = (n(r)?, n(m)?);
    if m < 2 || r == 0 {
        return Err(format!("`{s}`: at least one resource and two members"));
    }
    Ok((r, m))
}
