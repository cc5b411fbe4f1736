//! The lease service's decisions, for the model checker (`model/`) only: feature `model`,
//! which nothing else turns on. Each function is a thin door onto the one the server calls.

use std::time::Duration;

use super::confirm::{self, Purpose};
use super::marker::{EndMarkers, MarkerEvent};
use super::replay::{self, Retry};
use super::shared;
use crate::keys::Layout;

/// Whether a grant seen in a replica's watch-fed view may be confirmed from it, without a
/// linearizable read, to renew it (`for_release` false) or release it (`confirm.rs`).
pub fn view_may_confirm(for_release: bool, session: bool) -> bool {
    let purpose = if for_release {
        Purpose::Release
    } else {
        Purpose::Renew
    };
    confirm::view_may_confirm(purpose, session)
}

/// Whether a keyed acquire that found the resource held is answered with that grant
/// (`replay.rs`, `Retry::is_replayed`).
pub fn is_replayed(
    in_window: bool,
    same_holder: bool,
    key_matches: bool,
    found_session: Option<i64>,
    asked_session: Option<i64>,
) -> bool {
    Retry {
        in_window,
        same_holder,
        key_matches,
        found_session,
        asked_session,
    }
    .is_replayed()
}

/// Whether a keyed acquire is refused as a late duplicate (`replay.rs`).
pub fn key_spent(used: bool, alive: bool) -> bool {
    replay::key_spent(used, alive)
}

/// Whether a spare lease whose TTL was (re)started `age` ago is handed out without a keepalive
/// (`shared.rs`).
pub fn spare_is_fresh(age: Duration) -> bool {
    shared::fresh(age)
}

/// The release marker (key, value) a release of the grant of `resource` created at `revision`
/// on `lease` writes (`marker.rs`).
pub fn release_marker(resource: &str, revision: i64, lease: i64) -> (String, String) {
    let marker = EndMarkers::new(&Layout::new("/m/")).released(resource, revision, lease);
    let put = marker.put();
    (
        put.key.to_owned(),
        String::from_utf8_lossy(put.value).into_owned(),
    )
}

/// The close marker (key, value) closing session `id` writes (`marker.rs`).
pub fn close_marker(id: i64) -> (String, String) {
    let marker = EndMarkers::new(&Layout::new("/m/")).closed(id);
    let put = marker.put();
    (
        put.key.to_owned(),
        String::from_utf8_lossy(put.value).into_owned(),
    )
}

/// Whether the event feed labels the deletion of the grant of `resource` created at `revision`
/// on `lease` `released`, given the markers (key, value) written in the deletion's revision
/// (`marker.rs`, `Ends::released`); else it is `expired`.
pub fn labelled_released(
    markers: &[(String, String)],
    resource: &str,
    revision: i64,
    lease: i64,
) -> bool {
    let events = markers.iter().map(|(key, value)| MarkerEvent {
        key: key.as_bytes(),
        value: value.as_bytes(),
    });
    EndMarkers::new(&Layout::new("/m/"))
        .read(events)
        .released(resource, revision, lease)
}
