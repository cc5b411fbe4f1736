//! Shared parts of the benchmarks (`leasebench`, `fencebench`): measurement summaries and tables,
//! the SVG chart, and the processes a benchmark starts for itself.
//!
//! Every benchmark measures its backends against the same dependencies in the same run,
//! interleaved round by round, and reports ratios: absolute figures on a shared 2-core machine
//! move by tens of percent between passes, ratios measured side by side do not.

pub mod chart;
pub mod report;
pub mod stack;
pub mod stats;

/// Runs `work` until it ends or the process gets SIGINT or SIGTERM. Dropping `work` drops what it
/// started (etcd, proxies, gateways), which kills those processes instead of orphaning them.
pub async fn until_interrupted<T>(
    work: impl std::future::Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<T> {
    tokio::select! {
        result = work => result,
        () = runtime::serve::terminated() => Err(anyhow::anyhow!("interrupted")),
    }
}
