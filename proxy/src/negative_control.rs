//! Deliberately broken behaviours, for the fault campaign's negative controls only: compiled
//! with the `negative-controls` feature (the `lease-proxy-controls` binary, never a release
//! build) and switched on by `LEASE_PROXY_NEGATIVE_CONTROL` naming one. The campaign must catch
//! each; a control it cannot catch proves nothing about the checker.

use std::sync::OnceLock;

/// The variable that names the control to switch on.
const VARIABLE: &str = "LEASE_PROXY_NEGATIVE_CONTROL";

/// A deliberately broken behaviour.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NegativeControl {
    /// `no-revoke-before-grant`: a fleet grants a resource to the member it is assigned to
    /// while another member still holds it (the decision grants what is held), and the grant's
    /// create no longer requires the ownership key to be absent — it overwrites the holder's.
    NoRevokeBeforeGrant,
}

/// The control switched on, if any (read once; an unknown name switches nothing on).
fn active() -> Option<NegativeControl> {
    static ACTIVE: OnceLock<Option<NegativeControl>> = OnceLock::new();
    *ACTIVE.get_or_init(|| {
        let name = std::env::var(VARIABLE).ok()?;
        let control = match name.as_str() {
            "no-revoke-before-grant" => NegativeControl::NoRevokeBeforeGrant,
            other => {
                tracing::error!(%other, "unknown negative control: none switched on");
                return None;
            }
        };
        tracing::warn!(
            ?control,
            "NEGATIVE CONTROL ON: this proxy is broken on purpose"
        );
        Some(control)
    })
}

/// Whether a fleet grants what another member holds, overwriting its ownership key.
pub(crate) fn no_revoke_before_grant() -> bool {
    active() == Some(NegativeControl::NoRevokeBeforeGrant)
}
