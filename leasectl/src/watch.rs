//! `leasectl watch`: lease events as JSON lines, resumed by the SDK across reconnections.

use futures::StreamExt;
use lease_proxy_client::Client;

use crate::error::Error;
use crate::oneshot::print_line;

/// Prints every event under `prefix` (after `last_event_id`, when given) until the stream ends
/// or leasectl is interrupted. The SDK reconnects and resumes by itself after transient
/// failures; an error it reports (say, a resume point etcd no longer has) is printed, and ends
/// leasectl with its status once the stream ends.
pub(crate) async fn run(
    client: &Client,
    prefix: &str,
    last_event_id: Option<String>,
) -> Result<u8, Error> {
    let mut events = client.watch(prefix, last_event_id);
    let mut failed = None;
    while let Some(event) = events.next().await {
        match event {
            Ok(event) => {
                failed = None;
                print_line(&event)?;
            }
            Err(e) => {
                eprintln!("leasectl: watch: {e}");
                failed = Some(Error::from(e).exit_code());
            }
        }
    }
    Ok(failed.unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use lease_proxy_client::{Event, EventKind};

    #[test]
    fn events_print_as_the_stream_carries_them() {
        let event = Event {
            id: "1234.0".into(),
            kind: EventKind::Expired,
            resource: "aisle-1".into(),
            holder: "robot-3".into(),
            token: 1200,
            revision: 1234,
            lease_id: "7587".into(),
            session: Some("99".into()),
        };
        assert_eq!(
            serde_json::to_string(&event).unwrap(),
            r#"{"id":"1234.0","type":"expired","resource":"aisle-1","holder":"robot-3","token":"1200","revision":1234,"lease_id":"7587","session":"99"}"#
        );
        let event = Event {
            kind: EventKind::Acquired,
            session: None,
            ..event
        };
        let printed = serde_json::to_value(&event).unwrap();
        assert_eq!(printed["type"], "acquired");
        assert!(printed.get("session").is_none());
    }
}
