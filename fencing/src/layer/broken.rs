//! The fault campaign's negative controls in the layer: defects put back on purpose so that the
//! campaign can show its checker catches them. They exist only with the `negative-controls`
//! feature (which only the campaign turns on); without it [`Broken`] is empty and no code of
//! theirs is compiled, so no release build carries them.

#[cfg(feature = "negative-controls")]
use std::sync::Arc;

#[cfg(feature = "negative-controls")]
use super::exchange::Exchange;
#[cfg(feature = "negative-controls")]
use crate::admission::Outcome;

/// Which defects a layer has on purpose: none, unless a negative control asked for one.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Broken {
    /// A write's permit ends, as complete, with the caller's request.
    #[cfg(feature = "negative-controls")]
    pub(super) release_with_caller: bool,
    /// A write's exchange deadline ignores the gate's.
    #[cfg(feature = "negative-controls")]
    pub(super) deadline_from_admission: bool,
}

/// Ends its exchange's permit, as complete, when the caller's request ends (answered or
/// abandoned) — the defect the exchange exists to fix.
#[cfg(feature = "negative-controls")]
pub(super) struct CallerRelease(pub(super) Arc<Exchange>);

#[cfg(feature = "negative-controls")]
impl Drop for CallerRelease {
    fn drop(&mut self) {
        self.0.end_now(Outcome::Complete);
    }
}
