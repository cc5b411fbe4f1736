//! Wake-ups across gateways: a permit's end that someone may be waiting for sends a
//! notification (`pg_notify` on [`CHANNEL`], only when the resource's mark is above the ended
//! write's token), and each gate listens on one connection of its own to wake its waiting
//! writes at once. Only latency depends on it: waiting writes poll anyway, and the rows alone
//! decide (see [`super`]).

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use tokio::sync::{oneshot, Notify};
use tokio_postgres::{AsyncMessage, NoTls};

use runtime::backoff::Backoff;

/// The notification channel.
pub(super) const CHANNEL: &str = "fence_inflight_ended";

/// Keeps a gate's listener running; dropping it (with the last clone of the gate) stops it.
#[derive(Debug)]
pub(super) struct Listener {
    _stop: oneshot::Sender<()>,
}

impl Listener {
    /// Starts listening on a connection made from `config`, waking `ended`'s waiters on every
    /// notification (and after each reconnection, since notifications may have been missed).
    /// Without a runtime to run on there is no listener, and waiting writes only poll.
    pub(super) fn start(
        config: tokio_postgres::Config,
        deadline: Duration,
        ended: Arc<Notify>,
    ) -> Option<Self> {
        let runtime = tokio::runtime::Handle::try_current().ok()?;
        let (stop, stopped) = oneshot::channel();
        runtime.spawn(run(config, deadline, ended, stopped));
        Some(Self { _stop: stop })
    }
}

async fn run(
    config: tokio_postgres::Config,
    deadline: Duration,
    ended: Arc<Notify>,
    mut stopped: oneshot::Receiver<()>,
) {
    let mut retry = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
    loop {
        tokio::select! {
            _ = &mut stopped => return,
            result = listen(&config, deadline, &ended) => {
                if let Err(e) = result {
                    tracing::debug!(error = %e, "listener for ended writes lost its connection");
                }
            }
        }
        ended.notify_waiters();
        tokio::select! {
            _ = &mut stopped => return,
            _ = tokio::time::sleep(retry.pause()) => {}
        }
    }
}

/// Listens until the connection fails.
async fn listen(
    config: &tokio_postgres::Config,
    deadline: Duration,
    ended: &Notify,
) -> Result<(), String> {
    let (client, mut connection) = tokio::time::timeout(deadline, config.connect(NoTls))
        .await
        .map_err(|_| format!("no connection within {deadline:?}"))?
        .map_err(|e| format!("{e:?}"))?;
    let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
    // The connection carries the client's requests only while it is polled: wait for both.
    let statement = format!("LISTEN {CHANNEL}");
    let listen = client.batch_execute(&statement);
    tokio::pin!(listen);
    let mut listening = false;
    loop {
        tokio::select! {
            result = &mut listen, if !listening => {
                result.map_err(|e| format!("{e:?}"))?;
                listening = true;
                // Anything ended before we listened was missed.
                ended.notify_waiters();
            }
            message = messages.next() => match message {
                Some(Ok(AsyncMessage::Notification(_))) => ended.notify_waiters(),
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(format!("{e:?}")),
                None => return Err("connection closed".into()),
            },
        }
    }
}
