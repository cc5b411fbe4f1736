//! Fleets: many members sharing many resources (docs/DESIGN.md §5.5).
//!
//! `assign` is the decision, pure: who should hold what, what to grant and what to revoke.

// Acted on by the reconciler and the API that come next.
#[allow(dead_code)]
pub(crate) mod assign;
