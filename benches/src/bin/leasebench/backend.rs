//! The seam between the measurement drivers and the two (three) ways of holding leases.

use std::future::Future;

/// One way to acquire, renew and release leases: raw etcd or lease-proxy.
pub(crate) trait Backend: Send + Sync + 'static {
    /// Proof of holding a resource.
    type Held: Send + Sync + 'static;

    /// Takes `resource` for `ttl` seconds; `None` when someone else holds it.
    fn acquire(
        &self,
        resource: String,
        ttl: u64,
    ) -> impl Future<Output = anyhow::Result<Option<Self::Held>>> + Send;

    /// Extends the lease by its TTL; an error when it is gone.
    fn renew(&self, held: &Self::Held) -> impl Future<Output = anyhow::Result<()>> + Send;

    /// Reads who holds the resource as a reader would: linearizable, an error when it is not
    /// held.
    fn read(&self, held: &Self::Held) -> impl Future<Output = anyhow::Result<()>> + Send;

    /// Gives the resource up.
    fn release(&self, held: &Self::Held) -> impl Future<Output = anyhow::Result<()>> + Send;
}
