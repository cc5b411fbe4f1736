//! "In flight means in flight at the storage" (docs/DESIGN.md §4), against the built fence-gateway:
//! an old holder's write whose exchange with the storage did not end cleanly — the gateway's
//! upstream timeout fired, the client disconnected while waiting or mid-body, the storage
//! answered before reading the whole body, the client was SIGKILLed mid-request — must still be
//! applied by the storage before a newer holder's write. The storage stand-in logs the order in
//! which it *applies* writes; per resource that order must be non-decreasing.
//!
//! Each scenario runs on the memory and SQLite stores (one gateway) and on PostgreSQL with two
//! gateways sharing it (old write through one, new write through the other).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::Command;
use std::time::Duration;

use common::GatewayProcess as Gateway;
use fencing::{Keyring, Token};
use lease_proxy_testkit::poll::{eventually, Probe};
use lease_proxy_testkit::recording::{Log, Storage};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// How long the storage takes to apply the old write; the gateway's grace is longer.
const APPLY: Duration = Duration::from_millis(1000);
const GRACE: &str = "2500ms";

/// Where the marks live, and how many gateways share them.
#[derive(Clone, Copy, Debug)]
enum Store {
    Memory,
    Sqlite,
    /// Two gateways on one PostgreSQL database: the old write goes through the first, the new
    /// one through the second.
    Postgres,
}

/// How the old holder's write goes wrong.
#[derive(Clone, Copy, Debug)]
enum Fault {
    /// The gateway's `--upstream-timeout` fires while the storage is still working.
    UpstreamTimeout,
    /// The client sends the whole write, then disconnects while waiting for the answer.
    DisconnectWaiting,
    /// The client sends half the body, then disconnects.
    DisconnectMidBody,
    /// The storage answers before reading the whole (slowly sent) body.
    EarlyAnswer,
    /// The client process is SIGKILLed with half its body sent.
    KilledMidBody,
}

struct Scene {
    _dir: tempfile::TempDir,
    keys: Keyring,
    applied: Log,
    old: Gateway,
    new: Option<Gateway>,
}

impl Scene {
    async fn new(store: Store) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let (key_file, keys) = common::key_file(dir.path());
        // The storage applies each write in a task of its own, as a real storage would: a
        // connection the gateway closes does not undo work under way. `x-mode: slow` takes
        // APPLY before applying, `early` answers first, `fast` neither.
        let storage = Storage::builder().modes(APPLY).start().await;
        let (upstream, applied) = (storage.url, storage.log);
        let flags = ["--upstream-timeout", "400ms", "--write-grace", GRACE];
        let start = |store: String| {
            let (upstream, key_file) = (upstream.clone(), key_file.clone());
            async move { Gateway::start_with_store(&upstream, &store, &key_file, &flags).await }
        };
        let (old, new) = match store {
            Store::Memory => (start("memory".into()).await, None),
            Store::Sqlite => {
                let marks = format!("sqlite:{}", dir.path().join("marks.db").display());
                (start(marks).await, None)
            }
            Store::Postgres => (
                start(common::postgres_url()).await,
                Some(start(common::postgres_url()).await),
            ),
        };
        Self {
            _dir: dir,
            keys,
            applied,
            old,
            new,
        }
    }

    fn head(&self, resource: &str, revision: u64, mode: &str, length: usize) -> String {
        format!(
            "PUT /w/{resource} HTTP/1.1\r\nhost: x\r\nfencing-resource: {resource}\r\n\
             fencing-token: {}\r\nx-mode: {mode}\r\ncontent-length: {length}\r\n\r\n",
            self.keys.mint(resource, Token::new(0, revision))
        )
    }

    /// A write sent and answered normally; its status.
    async fn write(&self, gateway: &Gateway, resource: &str, revision: u64, mode: &str) -> u16 {
        reqwest::Client::new()
            .put(format!("http://{}/w/{resource}", gateway.addr))
            .header("fencing-resource", resource)
            .header(
                "fencing-token",
                self.keys.mint(resource, Token::new(0, revision)),
            )
            .header("x-mode", mode)
            .body("new count")
            .send()
            .await
            .unwrap()
            .status()
            .as_u16()
    }

    /// The old holder's write (revision 10), gone wrong as `fault` says; returns once the fault
    /// has happened (the gateway may still be working on it).
    async fn old_write(&self, resource: &str, fault: Fault) {
        let addr = &self.old.addr;
        match fault {
            Fault::UpstreamTimeout => {
                let status = self.write(&self.old, resource, 10, "slow").await;
                assert_eq!(status, 504, "the gateway's upstream timeout did not fire");
            }
            Fault::DisconnectWaiting => {
                let mut s = TcpStream::connect(addr).await.unwrap();
                let body = "old count";
                s.write_all(self.head(resource, 10, "slow", body.len()).as_bytes())
                    .await
                    .unwrap();
                s.write_all(body.as_bytes()).await.unwrap();
                tokio::time::sleep(Duration::from_millis(200)).await;
                drop(s);
            }
            Fault::DisconnectMidBody => {
                let mut s = TcpStream::connect(addr).await.unwrap();
                s.write_all(self.head(resource, 10, "slow", 100).as_bytes())
                    .await
                    .unwrap();
                s.write_all(&[b'x'; 50]).await.unwrap();
                tokio::time::sleep(Duration::from_millis(200)).await;
                drop(s);
            }
            Fault::EarlyAnswer => {
                // The body trickles in over ~600 ms; the storage answers at once and applies
                // once it has the whole body.
                let mut s = TcpStream::connect(addr).await.unwrap();
                s.write_all(self.head(resource, 10, "early", 60).as_bytes())
                    .await
                    .unwrap();
                let mut answer = [0u8; 12];
                tokio::io::AsyncReadExt::read_exact(&mut s, &mut answer)
                    .await
                    .unwrap();
                assert_eq!(&answer, b"HTTP/1.1 200", "the storage did not answer early");
                // Detached: the body goes on trickling while the new write is sent.
                tokio::spawn(async move {
                    for _ in 0..6 {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        if s.write_all(&[b'x'; 10]).await.is_err() {
                            return;
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(500)).await;
                });
                // The new write arrives while the body is still on its way.
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Fault::KilledMidBody => {
                let head = self.head(resource, 10, "slow", 100);
                let port = addr.port();
                let script = format!(
                    "exec 3<>/dev/tcp/127.0.0.1/{port}; printf '%s' \"$HEAD\" >&3; \
                     printf 'xxxxxxxxxx' >&3; sleep 30"
                );
                let mut child = Command::new("bash")
                    .args(["-c", &script])
                    .env("HEAD", head)
                    .spawn()
                    .unwrap();
                tokio::time::sleep(Duration::from_millis(300)).await;
                child.kill().unwrap(); // SIGKILL
                child.wait().unwrap();
            }
        }
    }

    /// Waits until the storage has applied `n` writes of `resource` (or a deadline passes);
    /// returns their revisions in the order applied.
    async fn applied(&self, resource: &str, n: usize) -> Vec<u64> {
        let what = format!("the storage applying {n} writes of {resource}");
        let (revisions, _) = eventually(Duration::from_secs(5), &what, || async {
            let revisions: Vec<u64> = self
                .applied
                .all()
                .iter()
                .filter(|w| w.resource() == resource)
                .map(|w| w.revision().unwrap())
                .collect();
            if revisions.len() >= n {
                Probe::Done(revisions)
            } else {
                Probe::Not(format!("{revisions:?}"))
            }
        })
        .await;
        revisions
    }
}

async fn scenario(store: Store, fault: Fault) {
    let scene = Scene::new(store).await;
    let resource = common::unique("inflight");
    // The old holder's token is the mark.
    let first = scene.write(&scene.old, &resource, 10, "fast").await;
    assert_eq!(first, 200);
    scene.old_write(&resource, fault).await;
    // The new holder writes through the other gateway where there is one.
    let gateway = scene.new.as_ref().unwrap_or(&scene.old);
    let status = scene.write(gateway, &resource, 11, "fast").await;
    assert_eq!(status, 200, "{store:?} {fault:?}: the new holder's write");
    let order = scene.applied(&resource, 3).await;
    // Give a late old write every chance to show up after the new one.
    tokio::time::sleep(APPLY).await;
    let order = scene.applied(&resource, order.len()).await;
    assert!(
        order.windows(2).all(|w| w[0] <= w[1]),
        "{store:?} {fault:?}: the storage applied {order:?}: an evicted holder's write landed \
         after the newer holder's"
    );
}

macro_rules! scenarios {
    ($($name:ident: $store:expr, $fault:expr;)*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            scenario($store, $fault).await;
        }
    )*};
}

scenarios! {
    memory_upstream_timeout: Store::Memory, Fault::UpstreamTimeout;
    memory_disconnect_waiting: Store::Memory, Fault::DisconnectWaiting;
    memory_disconnect_mid_body: Store::Memory, Fault::DisconnectMidBody;
    memory_early_answer: Store::Memory, Fault::EarlyAnswer;
    memory_killed_mid_body: Store::Memory, Fault::KilledMidBody;
    sqlite_upstream_timeout: Store::Sqlite, Fault::UpstreamTimeout;
    sqlite_disconnect_waiting: Store::Sqlite, Fault::DisconnectWaiting;
    sqlite_disconnect_mid_body: Store::Sqlite, Fault::DisconnectMidBody;
    sqlite_early_answer: Store::Sqlite, Fault::EarlyAnswer;
    sqlite_killed_mid_body: Store::Sqlite, Fault::KilledMidBody;
    postgres_upstream_timeout: Store::Postgres, Fault::UpstreamTimeout;
    postgres_disconnect_waiting: Store::Postgres, Fault::DisconnectWaiting;
    postgres_disconnect_mid_body: Store::Postgres, Fault::DisconnectMidBody;
    postgres_early_answer: Store::Postgres, Fault::EarlyAnswer;
    postgres_killed_mid_body: Store::Postgres, Fault::KilledMidBody;
}
