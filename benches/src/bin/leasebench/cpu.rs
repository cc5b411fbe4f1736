//! Where the CPU went during a run: the whole machine, leasebench itself and the proxies it
//! started, from `/proc` (Linux; elsewhere every figure is absent). What is left of the
//! machine's busy time is etcd's (and anything else running).

use std::collections::BTreeMap;

/// Clock ticks per second of `/proc` times (`USER_HZ`, 100 on every Linux platform we run).
const TICKS_PER_SEC: f64 = 100.0;

/// Busy CPU seconds at one instant.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Sample {
    machine: f64,
    own: f64,
    proxies: f64,
    /// The measured side's own process (a proxy, a peer), if it has one.
    side: Option<f64>,
    /// etcd, if its pid is known.
    etcd: Option<f64>,
}

/// The processes a sample reads apart from the machine and leasebench.
pub(crate) struct Pids<'a> {
    /// The proxies started here.
    pub(crate) proxies: &'a [u32],
    /// The measured side's own process.
    pub(crate) side: Option<u32>,
    /// etcd.
    pub(crate) etcd: Option<u32>,
}

/// Busy seconds of the whole machine (user, nice, system, irq, softirq, steal).
fn machine() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let fields: Vec<f64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal …
    let busy = [0, 1, 2, 5, 6, 7]
        .iter()
        .filter_map(|&i| fields.get(i))
        .sum::<f64>();
    Some(busy / TICKS_PER_SEC)
}

/// User + system seconds of process `pid` (`self` for this one).
fn process(pid: &str) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command (which may hold spaces) start after the last ')'.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // rest[0] is field 3 (state); utime and stime are fields 14 and 15.
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / TICKS_PER_SEC)
}

/// Busy seconds now, of the machine, leasebench and each of `pids`.
pub(crate) fn sample(pids: &Pids<'_>) -> Option<Sample> {
    let of = |pid: Option<u32>| pid.and_then(|p| process(&p.to_string()));
    Some(Sample {
        machine: machine()?,
        own: process("self")?,
        proxies: pids
            .proxies
            .iter()
            .filter_map(|p| process(&p.to_string()))
            .sum(),
        side: of(pids.side),
        etcd: of(pids.etcd),
    })
}

/// CPU milliseconds per operation between `before` and `after`, by consumer.
pub(crate) fn per_op(before: Sample, after: Sample, ops: usize) -> BTreeMap<&'static str, f64> {
    let per = |s: f64| s * 1e3 / ops.max(1) as f64;
    let machine = after.machine - before.machine;
    let own = after.own - before.own;
    let proxies = after.proxies - before.proxies;
    let mut out = BTreeMap::from([
        ("machine", per(machine)),
        ("leasebench", per(own)),
        ("proxies", per(proxies)),
        ("etcd_and_rest", per((machine - own - proxies).max(0.0))),
    ]);
    if let (Some(b), Some(a)) = (before.side, after.side) {
        out.insert("side", per(a - b));
    }
    if let (Some(b), Some(a)) = (before.etcd, after.etcd) {
        out.insert("etcd", per(a - b));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_process_and_the_machine() {
        let me = std::process::id();
        let pids = Pids {
            proxies: &[me],
            side: Some(me),
            etcd: None,
        };
        let s = sample(&pids);
        if cfg!(target_os = "linux") {
            let s = s.unwrap_or_default();
            assert!(s.machine > 0.0 && s.own >= 0.0 && s.proxies >= 0.0);
            assert!(s.side.is_some() && s.etcd.is_none());
        }
        let a = Sample {
            machine: 1.0,
            own: 0.1,
            proxies: 0.2,
            side: Some(0.5),
            etcd: None,
        };
        let b = Sample {
            machine: 2.0,
            own: 0.3,
            proxies: 0.6,
            side: Some(0.7),
            etcd: None,
        };
        let p = per_op(a, b, 100);
        assert!((p["machine"] - 10.0).abs() < 1e-9);
        assert!((p["etcd_and_rest"] - 4.0).abs() < 1e-9);
        assert!((p["side"] - 2.0).abs() < 1e-9);
        assert!(!p.contains_key("etcd"));
    }
}
