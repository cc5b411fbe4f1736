//! The process's own gauges, as Prometheus' client libraries export them: resident memory, CPU
//! time and open file descriptors, read from `/proc/self` at each scrape (Linux only).

use opentelemetry::metrics::Meter;

/// Registers `process_resident_memory_bytes`, `process_cpu_seconds_total` and `process_open_fds`
/// on `meter`. Elsewhere than Linux, nothing.
pub(super) fn register(meter: &Meter) {
    if !cfg!(target_os = "linux") {
        return;
    }
    meter
        .u64_observable_gauge("process.resident_memory")
        .with_unit("By")
        .with_description("Resident memory of the process.")
        .with_callback(|o| {
            if let Some(bytes) = resident_bytes() {
                o.observe(bytes, &[]);
            }
        })
        .build();
    meter
        .f64_observable_counter("process.cpu")
        .with_unit("s")
        .with_description("CPU time of the process, user and system.")
        .with_callback(|o| {
            if let Some(seconds) = cpu_seconds() {
                o.observe(seconds, &[]);
            }
        })
        .build();
    meter
        .u64_observable_gauge("process.open_fds")
        .with_description("Open file descriptors of the process.")
        .with_callback(|o| {
            if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
                o.observe(fds.count() as u64, &[]);
            }
        })
        .build();
}

/// `VmRSS` of `/proc/self/status`, in bytes.
fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse::<u64>()
        .ok()?;
    Some(kib * 1024)
}

/// utime + stime of `/proc/self/stat`, in seconds (the kernel reports them in USER_HZ ticks,
/// which Linux fixes at 100 for userspace).
fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name, which is in parentheses and may contain spaces.
    let after = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = after.split(' ').collect();
    // utime and stime are fields 14 and 15 of the line; 12 and 13 after the name and state.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) as f64 / 100.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg(target_os = "linux")]
    fn reads_this_process() {
        assert!(resident_bytes().unwrap() > 1024 * 1024);
        // Spend a little CPU so that the count is above zero.
        let mut x = 0u64;
        for i in 0..20_000_000u64 {
            x = x.wrapping_add(i * i);
        }
        std::hint::black_box(x);
        assert!(cpu_seconds().unwrap() > 0.0);
    }
}
