//! The signals leasectl catches while `exec` runs (SIGINT, SIGTERM, SIGHUP), delivered on a
//! channel so that they can be forwarded to the command.

use nix::sys::signal::Signal;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;

use crate::error::Error;

/// Catches SIGINT, SIGTERM and SIGHUP from now on (their default action, ending leasectl, no
/// longer happens) and sends each one received on the returned channel.
pub(crate) fn catch() -> Result<mpsc::Receiver<Signal>, Error> {
    let mut int = signal(SignalKind::interrupt()).map_err(Error::Handler)?;
    let mut term = signal(SignalKind::terminate()).map_err(Error::Handler)?;
    let mut hup = signal(SignalKind::hangup()).map_err(Error::Handler)?;
    let (tx, rx) = mpsc::channel(8);
    tokio::spawn(async move {
        loop {
            let caught = tokio::select! {
                Some(()) = int.recv() => Signal::SIGINT,
                Some(()) = term.recv() => Signal::SIGTERM,
                Some(()) = hup.recv() => Signal::SIGHUP,
                else => break,
            };
            if tx.send(caught).await.is_err() {
                break;
            }
        }
    });
    Ok(rx)
}
