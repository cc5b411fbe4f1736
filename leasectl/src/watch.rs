//! `leasectl watch`: lease events as JSON lines, resumed by the SDK across reconnections.

use futures::StreamExt;
use lease_proxy_client::{Client, Error as ClientError, Event, EventKind};
use serde_json::{json, Value};

use crate::error::Error;
use crate::oneshot::print_line;

/// Prints every event under `prefix` (after `last_event_id`, when given) until the stream ends
/// or leasectl is interrupted. A resume point etcd no longer has is an error (list again and
/// watch without `--last-event-id`); other errors are reported and the SDK reconnects.
pub(crate) async fn run(
    client: &Client,
    prefix: &str,
    last_event_id: Option<String>,
) -> Result<u8, Error> {
    let mut events = client.watch(prefix, last_event_id);
    while let Some(event) = events.next().await {
        match event {
            Ok(event) => print_line(&event_json(&event))?,
            Err(e @ ClientError::Compacted) => return Err(e.into()),
            Err(e) => eprintln!("leasectl: watch: {e} (reconnecting)"),
        }
    }
    Ok(0)
}

/// An event as the stream's `data` carries it, with its `id`.
fn event_json(e: &Event) -> Value {
    let kind = match e.kind {
        EventKind::Acquired => "acquired",
        EventKind::Released => "released",
        EventKind::Expired => "expired",
    };
    let mut v = json!({
        "id": e.id,
        "type": kind,
        "resource": e.resource,
        "holder": e.holder,
        "token": e.token.to_string(),
        "revision": e.revision,
        "lease_id": e.lease_id,
    });
    if let (Some(map), Some(session)) = (v.as_object_mut(), &e.session) {
        map.insert("session".to_owned(), json!(session));
    }
    v
}
