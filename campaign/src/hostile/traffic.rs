//! The traffic itself: hostile requests at a modest rate, aimed at the live `/v1` leases read
//! from etcd every second, every answer judged.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::time::Duration;

use etcd_client::{Client, GetOptions};
use lease_proxy_testkit::v3_hostile::{needle_pair, needles, Gen, Leases, Request, MARKERS};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::answers::{check_answer, endpoint, int, Finding};
use super::HOLDERS;

/// How many holder records (seen in etcd) are kept as needles besides the sentinels.
const HOLDER_NEEDLES: usize = 64;

/// How [`traffic`] runs.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The proxies' client URLs; requests alternate between them.
    pub proxy_urls: Vec<String>,
    /// etcd's client URLs, read directly to learn the live `/v1` leases.
    pub etcd_endpoints: Vec<String>,
    /// The generator's seed.
    pub seed: u64,
    /// Requests started per second, at most.
    pub rate: f64,
    /// Requests in flight, at most.
    pub in_flight: usize,
    /// How long one request may take before it counts as a timeout.
    pub timeout: Duration,
    /// How often etcd is read for live leases and holder records.
    pub harvest_every: Duration,
}

impl Settings {
    /// The campaign's defaults: 20 requests per second, 4 in flight, 3 s per request, a harvest
    /// every second — little enough not to disturb a timing-sensitive run on two cores.
    pub fn new(proxy_urls: Vec<String>, etcd_endpoints: Vec<String>, seed: u64) -> Self {
        Self {
            proxy_urls,
            etcd_endpoints,
            seed,
            rate: 20.0,
            in_flight: 4,
            timeout: Duration::from_secs(3),
            harvest_every: Duration::from_secs(1),
        }
    }
}

/// What the traffic did and found (serialised into the campaign report).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stats {
    /// The generator's seed.
    pub seed: u64,
    /// Requests sent.
    pub sent: u64,
    /// Requests answered (any status).
    pub answered: u64,
    /// Answers by status class (`2xx`, `4xx`, `5xx`, …).
    pub by_class: BTreeMap<String, u64>,
    /// Answers by status code.
    pub by_status: BTreeMap<u16, u64>,
    /// Requests without an answer: connection refused or reset, body cut (faults).
    pub transport_errors: u64,
    /// Requests not answered within the timeout (a paused proxy, a blackholed relay).
    pub timeouts: u64,
    /// Requests that named a live `/v1` lease (or another lease of the proxies' own).
    pub aimed_at_native: u64,
    /// Reads of etcd for live leases that succeeded.
    pub harvests: u64,
    /// Reads of etcd for live leases that failed (faults).
    pub harvest_errors: u64,
    /// Statements about a proxy lease that answers made and the checks judged (time-to-live and
    /// keepalive results about one): shows the lease checks were not vacuous.
    pub native_answers_judged: u64,
    /// Distinct leases of the proxies' own seen in etcd during the run.
    pub native_leases_seen: u64,
    /// What answers showed that they must not: a needle from outside the namespace, a proxy's
    /// own lease revoked, renewed, inspected or used through `/v3`. Empty in a correct run.
    pub violations: Vec<String>,
}

/// What one read of etcd showed.
#[derive(Debug, Default)]
struct Harvest {
    /// `/v1` holder records: (key, value, lease).
    holders: Vec<(Vec<u8>, Vec<u8>, i64)>,
    /// Every live lease.
    leases: Vec<i64>,
    /// Leases marked as granted through `/v3`.
    marked: HashSet<i64>,
}

async fn harvest(client: &mut Client) -> anyhow::Result<Harvest> {
    let holders = client
        .get(HOLDERS, Some(GetOptions::new().with_prefix()))
        .await?
        .kvs()
        .iter()
        .map(|kv| (kv.key().to_vec(), kv.value().to_vec(), kv.lease()))
        .collect();
    let leases = client
        .leases()
        .await?
        .leases()
        .iter()
        .map(|l| l.id())
        .collect();
    let marked = client
        .get(
            MARKERS,
            Some(GetOptions::new().with_prefix().with_keys_only()),
        )
        .await?
        .kvs()
        .iter()
        .filter_map(|kv| std::str::from_utf8(kv.key().strip_prefix(MARKERS)?).ok())
        .filter_map(|id| id.parse().ok())
        .collect();
    Ok(Harvest {
        holders,
        leases,
        marked,
    })
}

/// One read of etcd within `within`, connecting first if needed.
async fn harvest_once(
    client: &mut Option<Client>,
    endpoints: &[String],
    within: Duration,
) -> anyhow::Result<Harvest> {
    let attempt = async {
        if client.is_none() {
            let options = etcd_client::ConnectOptions::new()
                .with_connect_timeout(Duration::from_millis(500))
                .with_timeout(within);
            *client = Some(Client::connect(endpoints, Some(options)).await?);
        }
        match client.as_mut() {
            Some(c) => harvest(c).await,
            None => anyhow::bail!("no etcd client"),
        }
    };
    match tokio::time::timeout(within, attempt).await {
        Ok(Ok(h)) => Ok(h),
        Ok(Err(e)) => Err(e),
        Err(_) => anyhow::bail!("etcd read timed out"),
    }
}

/// Reads etcd every `every` and publishes what it saw, until `stop`.
async fn harvester(
    endpoints: Vec<String>,
    every: Duration,
    tx: tokio::sync::mpsc::Sender<anyhow::Result<Harvest>>,
    stop: CancellationToken,
) {
    let mut client = None;
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let result = harvest_once(&mut client, &endpoints, every.max(Duration::from_secs(2))).await;
        if result.is_err() {
            // A fresh connection next time: the old one may be stuck on a killed member.
            client = None;
        }
        if tx.send(result).await.is_err() {
            return;
        }
    }
}

/// One request's outcome.
enum Outcome {
    Answered(u16, String),
    Transport,
    Timeout,
}

/// What the traffic knows about leases, from etcd and from its own grants.
#[derive(Debug, Default)]
struct Known {
    /// Every lease of the proxies' own seen: holders' leases, and leases neither holding a key
    /// nor marked as `/v3` (spares, wait queues).
    native: HashSet<i64>,
    /// Every lease seen marked as `/v3`, or granted to this traffic through `/v3`.
    v3: HashSet<i64>,
    /// Recent holder records, as needles.
    holder_values: VecDeque<Vec<u8>>,
}

impl Known {
    fn absorb(&mut self, h: &Harvest) {
        self.v3.extend(h.marked.iter().copied());
        let holder_leases: HashSet<i64> = h.holders.iter().map(|(_, _, l)| *l).collect();
        for (_, value, lease) in &h.holders {
            if *lease != 0 {
                self.native.insert(*lease);
            }
            if !self.holder_values.contains(value) {
                self.holder_values.push_back(value.clone());
                if self.holder_values.len() > HOLDER_NEEDLES {
                    self.holder_values.pop_front();
                }
            }
        }
        for id in &h.leases {
            if !h.marked.contains(id) && !holder_leases.contains(id) && !self.v3.contains(id) {
                self.native.insert(*id);
            }
        }
    }

    fn needles(&self) -> Vec<Vec<u8>> {
        let mut all = needles();
        for value in &self.holder_values {
            all.extend(needle_pair(value));
        }
        all
    }
}

/// Sends hostile `/v3` requests to the proxies until `stop`, then waits for the ones in flight
/// (each bounded by the timeout) and returns what happened.
///
/// Every `harvest_every` it reads etcd for the live `/v1` holders' leases and the proxies' other
/// leases, and aims the generator at them (rotating among holders), with the holder's key as the
/// `/v1` key it names. It grants itself one `/v3` lease through the proxies, the one it may lock
/// with. Findings about a lease are dropped if that lease is ever seen marked as `/v3`'s or was
/// granted to this traffic (a lease read between its `/v3` grant and its marking, e.g. on a
/// paused proxy, looks like a proxy's own for a while).
pub async fn traffic(settings: Settings, stop: CancellationToken) -> Stats {
    let mut stats = Stats {
        seed: settings.seed,
        ..Stats::default()
    };
    let http = match reqwest::Client::builder()
        .timeout(settings.timeout)
        .connect_timeout(settings.timeout.min(Duration::from_secs(1)))
        .build()
    {
        Ok(c) => c,
        Err(e) => {
            stats.violations.push(format!("no HTTP client: {e}"));
            return stats;
        }
    };
    if settings.proxy_urls.is_empty() {
        return stats;
    }
    let mut gen = Gen::new(settings.seed, Leases::default());
    let mut known = Known::default();
    let mut needles = known.needles();
    let mut findings: Vec<Finding> = Vec::new();
    let mut rotation = 0usize;

    let harvest_stop = stop.child_token();
    let (tx, mut rx) = tokio::sync::mpsc::channel(4);
    let harvesting = tokio::spawn(harvester(
        settings.etcd_endpoints.clone(),
        settings.harvest_every,
        tx,
        harvest_stop.clone(),
    ));

    let mut requests: JoinSet<(Request, Outcome)> = JoinSet::new();
    let mut granting: Option<tokio::task::JoinHandle<Option<i64>>> = None;
    let period = Duration::from_secs_f64(1.0 / settings.rate.max(0.1));
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let in_flight = settings.in_flight.max(1);

    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            Some(result) = rx.recv() => {
                match result {
                    Ok(h) => {
                        stats.harvests += 1;
                        known.absorb(&h);
                        needles = known.needles();
                        let mut leases = gen.leases();
                        let holders: Vec<&(Vec<u8>, Vec<u8>, i64)> =
                            h.holders.iter().filter(|(_, _, l)| *l != 0).collect();
                        if !holders.is_empty() {
                            let (key, _, lease) = holders[rotation % holders.len()];
                            leases.native = *lease;
                            gen.set_holder_key(key);
                        }
                        let others: Vec<i64> =
                            known.native.iter().copied().filter(|id| *id != leases.native).collect();
                        if !others.is_empty() {
                            leases.spare = others[rotation % others.len()];
                        }
                        rotation += 1;
                        gen.set_leases(leases);
                    }
                    Err(_) => stats.harvest_errors += 1,
                }
                // The traffic's own /v3 lease, until it has one.
                if gen.leases().own == 0 && granting.as_ref().is_none_or(|g| g.is_finished()) {
                    if let Some(done) = granting.take() {
                        if let Ok(Some(id)) = done.await {
                            known.v3.insert(id);
                            let mut leases = gen.leases();
                            leases.own = id;
                            gen.set_leases(leases);
                        }
                    }
                    if gen.leases().own == 0 {
                        let url = format!("{}/v3/lease/grant", settings.proxy_urls[rotation % settings.proxy_urls.len()]);
                        let http = http.clone();
                        granting = Some(tokio::spawn(grant_own(http, url)));
                    }
                }
            }
            _ = tick.tick(), if requests.len() < in_flight => {
                let request = gen.request();
                if request.leases.iter().any(|id| known.native.contains(id)) {
                    stats.aimed_at_native += 1;
                }
                let url = &settings.proxy_urls[(stats.sent as usize) % settings.proxy_urls.len()];
                let url = format!("{url}{}", request.path);
                stats.sent += 1;
                let http = http.clone();
                requests.spawn(async move {
                    let outcome = send(&http, &url, &request.body).await;
                    (request, outcome)
                });
            }
            Some(Ok((request, outcome))) = requests.join_next() => {
                record(&mut stats, &mut known, &mut findings, &needles, &request, outcome);
            }
        }
    }
    while let Some(done) = requests.join_next().await {
        if let Ok((request, outcome)) = done {
            record(
                &mut stats,
                &mut known,
                &mut findings,
                &needles,
                &request,
                outcome,
            );
        }
    }
    harvest_stop.cancel();
    let _ = harvesting.await;
    if let Some(g) = granting.take() {
        if let Ok(Some(id)) = g.await {
            known.v3.insert(id);
        }
    }
    // One last look at the markers: a lease granted through /v3 on a proxy paused before it
    // marked it may have been taken for a proxy's own meanwhile.
    let mut client = None;
    if let Ok(h) = harvest_once(&mut client, &settings.etcd_endpoints, settings.timeout).await {
        known.v3.extend(h.marked);
    }
    stats.native_leases_seen = known.native.difference(&known.v3).count() as u64;
    stats.violations.extend(
        findings
            .into_iter()
            .filter(|f| f.lease.is_none_or(|id| !known.v3.contains(&id)))
            .map(|f| f.message),
    );
    stats
}

/// Grants the traffic's own `/v3` lease through a proxy.
async fn grant_own(http: reqwest::Client, url: String) -> Option<i64> {
    let resp = http.post(url).body(r#"{"TTL":600}"#).send().await.ok()?;
    if !resp.status().is_success() {
        return None;
    }
    let v: Value = resp.json().await.ok()?;
    Some(int(&v["ID"])).filter(|id| *id != 0)
}

async fn send(http: &reqwest::Client, url: &str, body: &str) -> Outcome {
    let result = async {
        let resp = http.post(url).body(body.to_owned()).send().await?;
        let status = resp.status().as_u16();
        let text = resp.text().await?;
        Ok::<_, reqwest::Error>((status, text))
    }
    .await;
    match result {
        Ok((status, text)) => Outcome::Answered(status, text),
        Err(e) if e.is_timeout() => Outcome::Timeout,
        Err(_) => Outcome::Transport,
    }
}

fn record(
    stats: &mut Stats,
    known: &mut Known,
    findings: &mut Vec<Finding>,
    needles: &[Vec<u8>],
    request: &Request,
    outcome: Outcome,
) {
    let (status, text) = match outcome {
        Outcome::Answered(status, text) => (status, text),
        Outcome::Transport => {
            stats.transport_errors += 1;
            return;
        }
        Outcome::Timeout => {
            stats.timeouts += 1;
            return;
        }
    };
    stats.answered += 1;
    *stats.by_status.entry(status).or_default() += 1;
    *stats
        .by_class
        .entry(format!("{}xx", status / 100))
        .or_default() += 1;
    // A lease granted to this traffic is a /v3 lease, whatever etcd showed before its marker.
    if endpoint(&request.path) == "lease/grant" && (200..300).contains(&status) {
        if let Ok(v) = serde_json::from_str::<Value>(&text) {
            let id = int(&v["ID"]);
            if id != 0 {
                known.v3.insert(id);
            }
        }
    }
    let native = |id: i64| id != 0 && known.native.contains(&id) && !known.v3.contains(&id);
    let verdict = check_answer(request, status, &text, needles, &native);
    stats.native_answers_judged += verdict.judged;
    findings.extend(verdict.findings);
}
