//! A TCP fault relay: forwards connections from a loopback port to a target, and on command
//! stalls them (blackhole: nothing moves either way until healed, like a partition that TCP
//! rides out), delays every chunk, or resets them (RST both ways, new connections too).

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// What the relay does to traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Forward as is.
    Pass,
    /// Forward nothing, accept nothing new, until the mode changes.
    Blackhole,
    /// Hold every chunk this long before forwarding it.
    Delay(Duration),
    /// Reset every connection, both ways (RST: what was in flight through the relay is lost),
    /// and every new one at once, until the mode changes.
    Reset,
}

/// A running relay; stops when dropped.
pub struct Relay {
    addr: SocketAddr,
    mode: watch::Sender<Mode>,
    task: JoinHandle<()>,
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Relay {
    /// Starts a relay on a free loopback port towards `target`.
    pub async fn start(target: SocketAddr) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (mode, watching) = watch::channel(Mode::Pass);
        let task = tokio::spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            loop {
                let Ok((inbound, _)) = listener.accept().await else {
                    continue;
                };
                let watching = watching.clone();
                connections.spawn(connection(inbound, target, watching));
                while connections.try_join_next().is_some() {}
            }
        });
        Ok(Self { addr, mode, task })
    }

    /// The relay's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The relay's URL (`http://addr`).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Changes what the relay does, for existing and new connections.
    pub fn set(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }
}

/// Waits while the relay is blackholed.
async fn passable(mode: &mut watch::Receiver<Mode>) {
    let _ = mode.wait_for(|m| *m != Mode::Blackhole).await;
}

/// One relayed connection: pumps both ways until both ends are done, or the mode turns to
/// [`Mode::Reset`].
async fn connection(
    mut inbound: TcpStream,
    target: SocketAddr,
    mut watching: watch::Receiver<Mode>,
) {
    passable(&mut watching).await;
    let resetting = *watching.borrow() == Mode::Reset;
    let outbound = if resetting {
        None
    } else {
        TcpStream::connect(target).await.ok()
    };
    let Some(mut outbound) = outbound else {
        let _ = inbound.set_zero_linger();
        return;
    };
    let _ = inbound.set_nodelay(true);
    let _ = outbound.set_nodelay(true);
    {
        let (ri, wi) = inbound.split();
        let (ro, wo) = outbound.split();
        let mut reset = watching.clone();
        tokio::select! {
            _ = async {
                tokio::join!(
                    pump(ri, wo, watching.clone()),
                    pump(ro, wi, watching.clone())
                )
            } => return,
            _ = reset.wait_for(|m| *m == Mode::Reset) => {}
        }
    }
    // Closing with a zero linger sends RST, discarding what the kernel still buffers.
    let _ = inbound.set_zero_linger();
    let _ = outbound.set_zero_linger();
}

async fn pump(
    mut from: tokio::net::tcp::ReadHalf<'_>,
    mut to: tokio::net::tcp::WriteHalf<'_>,
    mut mode: watch::Receiver<Mode>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        passable(&mut mode).await;
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let current = *mode.borrow();
        if let Mode::Delay(d) = current {
            tokio::time::sleep(d).await;
        }
        passable(&mut mode).await;
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    async fn echo() -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let (mut s, _) = l.accept().await.unwrap();
                tokio::spawn(async move {
                    let mut b = [0u8; 16];
                    while let Ok(n) = s.read(&mut b).await {
                        if n == 0 || s.write_all(&b[..n]).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        addr
    }

    async fn round_trip(s: &mut TcpStream) -> Option<u8> {
        s.write_all(b"x").await.ok()?;
        let mut b = [0u8; 1];
        tokio::time::timeout(Duration::from_millis(300), s.read_exact(&mut b))
            .await
            .ok()?
            .ok()?;
        Some(b[0])
    }

    #[tokio::test]
    async fn passes_stalls_and_heals() {
        let relay = Relay::start(echo().await).await.unwrap();
        let mut s = TcpStream::connect(relay.addr()).await.unwrap();
        assert_eq!(round_trip(&mut s).await, Some(b'x'));
        relay.set(Mode::Blackhole);
        assert_eq!(round_trip(&mut s).await, None);
        relay.set(Mode::Pass);
        // The stalled byte and a new one both arrive once healed.
        let mut b = [0u8; 2];
        s.write_all(b"y").await.unwrap();
        tokio::time::timeout(Duration::from_secs(2), s.read_exact(&mut b))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&b, b"xy");
        relay.set(Mode::Delay(Duration::from_millis(150)));
        let t = tokio::time::Instant::now();
        s.write_all(b"z").await.unwrap();
        let mut b = [0u8; 1];
        s.read_exact(&mut b).await.unwrap();
        assert!(t.elapsed() >= Duration::from_millis(290));
    }

    #[tokio::test]
    async fn resets_existing_and_new_connections() {
        let relay = Relay::start(echo().await).await.unwrap();
        let mut s = TcpStream::connect(relay.addr()).await.unwrap();
        assert_eq!(round_trip(&mut s).await, Some(b'x'));
        relay.set(Mode::Reset);
        let mut b = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_secs(1), s.read(&mut b)).await;
        assert!(matches!(read, Ok(Err(_)) | Ok(Ok(0))), "{read:?}");
        let mut fresh = TcpStream::connect(relay.addr()).await.unwrap();
        assert_eq!(round_trip(&mut fresh).await, None);
        relay.set(Mode::Pass);
        let mut healed = TcpStream::connect(relay.addr()).await.unwrap();
        assert_eq!(round_trip(&mut healed).await, Some(b'x'));
    }
}
