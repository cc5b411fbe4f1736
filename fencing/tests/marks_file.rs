//! The fence-gateway binary on a SQLite marks file: readiness on a full disk, one gateway per
//! file, and a file removed, replaced or restored from a backup never lowering a mark.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{key_file, GatewayProcess};
use fencing::{Keyring, Token};
use lease_proxy_testkit::poll::answers;
use lease_proxy_testkit::recording::Storage;

/// A small tmpfs mounted for the test, unmounted when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    /// `None` when this machine does not let the test mount (not root, no `CAP_SYS_ADMIN`).
    fn mount(at: &Path, size: &str) -> Option<Self> {
        std::fs::create_dir_all(at).unwrap();
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(at)
            .status()
            .is_ok_and(|s| s.success());
        mounted.then(|| Self(at.to_owned()))
    }

    /// Fills the file system to its last byte with `filler`.
    fn fill(&self) -> PathBuf {
        use std::io::Write as _;
        let path = self.0.join("filler");
        let mut file = std::fs::File::create(&path).unwrap();
        for chunk in [64 * 1024, 4096, 1] {
            while file.write_all(&vec![0u8; chunk]).is_ok() {}
        }
        let _ = file.sync_all();
        path
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

async fn put(gw: &GatewayProcess, keys: &Keyring, resource: &str, revision: u64) -> u16 {
    reqwest::Client::new()
        .put(format!("{}/inventory/{resource}", gw.url))
        .header("fencing-resource", resource)
        .header(
            "fencing-token",
            keys.mint(resource, Token::new(0, revision)),
        )
        .body("count")
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

/// Polls `/readyz` until it answers `want`, for at most `within`.
async fn readyz_becomes(gw: &GatewayProcess, want: u16, within: Duration) {
    let readyz = format!("{}/readyz", gw.url);
    answers(&reqwest::Client::new(), &readyz, want, within).await;
}

/// On a full disk every raise fails, and `/readyz` says so; once there is room again it is
/// ready again and raises go through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_is_503_while_the_disk_is_full() {
    let dir = tempfile::tempdir().unwrap();
    // The test command runs as root (it installs etcd and PostgreSQL); a run that cannot mount
    // fails rather than passing without having checked anything.
    let disk = Tmpfs::mount(&dir.path().join("disk"), "2m")
        .expect("cannot mount a tmpfs here: this test needs root with CAP_SYS_ADMIN");
    let (keys_path, keys) = key_file(dir.path());
    let storage = Storage::start().await;
    let store = format!("sqlite:{}", disk.0.join("marks.db").display());
    let gw = GatewayProcess::start_with_store(&storage.url, &store, &keys_path, &[]).await;
    assert_eq!(put(&gw, &keys, "aisle-1", 1).await, 200);
    let filler = disk.fill();
    assert_eq!(
        put(&gw, &keys, "aisle-2", 1).await,
        503,
        "a raise on a full disk"
    );
    assert_eq!(
        put(&gw, &keys, "aisle-1", 2).await,
        503,
        "a raise on a full disk"
    );
    readyz_becomes(&gw, 503, Duration::from_secs(10)).await;
    std::fs::remove_file(filler).unwrap();
    readyz_becomes(&gw, 200, Duration::from_secs(10)).await;
    assert_eq!(put(&gw, &keys, "aisle-2", 1).await, 200);
    assert_eq!(put(&gw, &keys, "aisle-1", 2).await, 200);
    drop(gw);
}

/// What the storage applied, in order: the revision of each token that reached it.
fn applied(storage: &Storage) -> Vec<u64> {
    storage
        .log
        .take()
        .iter()
        .filter(|r| r.method == "PUT")
        .map(|r| r.revision().unwrap())
        .collect()
}

async fn put_era(gw: &GatewayProcess, keys: &Keyring, resource: &str, token: Token) -> u16 {
    reqwest::Client::new()
        .put(format!("{}/inventory/{resource}", gw.url))
        .header("fencing-resource", resource)
        .header("fencing-token", keys.mint(resource, token))
        .body("count")
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

/// F3: one SQLite file serves one gateway. A second gateway on it does not start (exit 1, the
/// binary's status for a store it cannot open) and says why; the first goes on serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_gateway_on_the_same_file_fails_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let (keys_path, keys) = key_file(dir.path());
    let storage = Storage::start().await;
    let store = format!("sqlite:{}", dir.path().join("marks.db").display());
    let first = GatewayProcess::start_with_store(&storage.url, &store, &keys_path, &[]).await;
    assert_eq!(put(&first, &keys, "aisle-1", 10).await, 200);
    let (status, stderr) = common::gateway_refuses(&storage.url, &store, &keys_path, &[]);
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("in use by another process"), "{stderr}");
    assert_eq!(put(&first, &keys, "aisle-1", 11).await, 200);
    assert_eq!(put(&first, &keys, "aisle-1", 10).await, 409);
    assert_eq!(applied(&storage), [10, 11]);
}

/// F3: the marks file removed (and another put in its place) while the gateway runs: every
/// write is refused and `/readyz` is 503 from the next raise or probe on; a restart on what is
/// now at the path is refused, so the lower token is never admitted (not 20, 21, 19). The way
/// forward is an era floor: every token of an older era is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_marks_file_removed_while_running_is_noticed_and_never_lowers_a_mark() {
    let dir = tempfile::tempdir().unwrap();
    let (keys_path, keys) = key_file(dir.path());
    let storage = Storage::start().await;
    let path = dir.path().join("marks.db");
    let store = format!("sqlite:{}", path.display());
    let gw = GatewayProcess::start_with_store(&storage.url, &store, &keys_path, &[]).await;
    assert_eq!(put(&gw, &keys, "aisle-1", 20).await, 200);
    assert_eq!(put(&gw, &keys, "aisle-1", 21).await, 200);
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    readyz_becomes(&gw, 503, Duration::from_secs(10)).await;
    // A raise and a write at the mark alike.
    assert_eq!(put(&gw, &keys, "aisle-2", 1).await, 503);
    assert_eq!(put(&gw, &keys, "aisle-1", 21).await, 503);
    let refused = reqwest::Client::new()
        .put(format!("{}/inventory/aisle-1", gw.url))
        .header("fencing-resource", "aisle-1")
        .header("fencing-token", keys.mint("aisle-1", Token::new(0, 21)))
        .send()
        .await
        .unwrap();
    assert_eq!(
        refused.headers()["content-type"],
        "application/problem+json"
    );
    let body: serde_json::Value = refused.json().await.unwrap();
    assert!(body["type"]
        .as_str()
        .unwrap()
        .ends_with("/fence-store-unavailable"));
    // An empty marks file put in its place changes nothing.
    rusqlite::Connection::open(&path)
        .unwrap()
        .execute_batch("CREATE TABLE t (x)")
        .unwrap();
    assert_eq!(put(&gw, &keys, "aisle-1", 22).await, 503);
    drop(gw);

    let (status, stderr) = common::gateway_refuses(&storage.url, &store, &keys_path, &[]);
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("--era-floor"), "{stderr}");
    std::fs::remove_file(&path).unwrap();
    let (status, stderr) = common::gateway_refuses(&storage.url, &store, &keys_path, &[]);
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("missing"), "{stderr}");

    // The operator bumps the proxies' era to 1 and starts the gateway with that floor.
    let flags = ["--era-floor", "1"];
    let gw = GatewayProcess::start_with_store(&storage.url, &store, &keys_path, &flags).await;
    assert_eq!(put(&gw, &keys, "aisle-1", 19).await, 409);
    assert_eq!(put(&gw, &keys, "aisle-1", 21).await, 409);
    assert_eq!(put_era(&gw, &keys, "aisle-1", Token::new(1, 3)).await, 200);
    drop(gw);
    // The floor is kept in the file: it holds without the flag.
    let gw = GatewayProcess::start_with_store(&storage.url, &store, &keys_path, &[]).await;
    assert_eq!(put(&gw, &keys, "aisle-9", 30).await, 409);
    assert_eq!(applied(&storage), [20, 21, 3]);
}

/// F3: an older copy of the marks file (a backup taken while the gateway ran, before a raise)
/// put back is refused at start, rather than letting 19 in after 21; with an era floor above
/// every era the store used, every old token is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_older_copy_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let (keys_path, keys) = key_file(dir.path());
    let storage = Storage::start().await;
    let path = dir.path().join("marks.db");
    let backup = dir.path().join("backup.db");
    let store = format!("sqlite:{}", path.display());
    let gw = GatewayProcess::start_with_store(&storage.url, &store, &keys_path, &[]).await;
    assert_eq!(put(&gw, &keys, "aisle-1", 20).await, 200);
    // An online backup, as `sqlite3 marks.db .backup` takes one.
    rusqlite::Connection::open(&path)
        .unwrap()
        .execute(&format!("VACUUM INTO '{}'", backup.display()), [])
        .unwrap();
    assert_eq!(put(&gw, &keys, "aisle-1", 21).await, 200);
    drop(gw);
    for suffix in ["-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    std::fs::copy(&backup, &path).unwrap();

    let (status, stderr) = common::gateway_refuses(&storage.url, &store, &keys_path, &[]);
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("older copy"), "{stderr}");
    // A floor that is not above the era the store has used does not do.
    let (status, stderr) =
        common::gateway_refuses(&storage.url, &store, &keys_path, &["--era-floor", "0"]);
    assert_eq!(status.code(), Some(1), "{stderr}");

    let flags = ["--era-floor", "1"];
    let gw = GatewayProcess::start_with_store(&storage.url, &store, &keys_path, &flags).await;
    assert_eq!(put(&gw, &keys, "aisle-1", 19).await, 409);
    assert_eq!(put(&gw, &keys, "aisle-1", 20).await, 409);
    assert_eq!(put_era(&gw, &keys, "aisle-1", Token::new(1, 2)).await, 200);
    assert_eq!(applied(&storage), [20, 21, 2]);
}

/// Copies the database at `from` into the database at `to` with SQLite's online backup API, as
/// `sqlite3.connect(to).backup(…)` or `sqlite3 to .restore from` do: page by page through
/// SQLite's own locking, into the same file (same device and inode).
fn online_backup(from: &Path, to: &Path) {
    let src = rusqlite::Connection::open(from).unwrap();
    let mut dst = rusqlite::Connection::open(to).unwrap();
    rusqlite::backup::Backup::new(&src, &mut dst)
        .unwrap()
        .run_to_completion(100, Duration::ZERO, None)
        .unwrap();
}

/// An older copy restored *into* the running gateway's marks file
/// (the online backup API writes the same file, so its device and inode do not change). The
/// resource is evicted from memory (`--idle-eviction 1s`), so its next write reads the mark
/// from the file: the gateway must notice that the file's generation is not the one it left
/// there, refuse every write and `/readyz`, and never admit 15 after 20 (not 10, 20, 15, 15,
/// 16). A restart is refused too (the first raise after the restore did not re-record it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_copy_restored_into_the_running_file_never_lowers_a_mark() {
    let dir = tempfile::tempdir().unwrap();
    let (keys_path, keys) = key_file(dir.path());
    let storage = Storage::start().await;
    let path = dir.path().join("marks.db");
    let backup = dir.path().join("backup.db");
    let store = format!("sqlite:{}", path.display());
    let flags = ["--idle-eviction", "1s", "--write-grace", "100ms"];
    let gw = GatewayProcess::start_with_store(&storage.url, &store, &keys_path, &flags).await;
    assert_eq!(put(&gw, &keys, "aisle-1", 10).await, 200);
    online_backup(&path, &backup);
    assert_eq!(put(&gw, &keys, "aisle-1", 20).await, 200);
    online_backup(&backup, &path);
    // Past the idle eviction: the next write of aisle-1 reads its mark from the file.
    tokio::time::sleep(Duration::from_millis(1600)).await;
    assert_eq!(put(&gw, &keys, "aisle-1", 15).await, 503, "15 after 20");
    readyz_becomes(&gw, 503, Duration::from_secs(5)).await;
    for revision in [15, 16, 20, 21] {
        assert_eq!(put(&gw, &keys, "aisle-1", revision).await, 503);
    }
    assert_eq!(put(&gw, &keys, "aisle-2", 1).await, 503);
    drop(gw);

    let (status, stderr) = common::gateway_refuses(&storage.url, &store, &keys_path, &[]);
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("older copy"), "{stderr}");
    let flags = ["--era-floor", "1"];
    let gw = GatewayProcess::start_with_store(&storage.url, &store, &keys_path, &flags).await;
    assert_eq!(put(&gw, &keys, "aisle-1", 15).await, 409);
    assert_eq!(put_era(&gw, &keys, "aisle-1", Token::new(1, 2)).await, 200);
    assert_eq!(applied(&storage), [10, 20, 2]);
}

/// The same restore while the resource is still in memory: the next raise's transaction does
/// not find the generation it expects, so it is refused and the restored file is not adopted
/// (the lock file keeps the generation reached before), and a restart is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raise_after_a_restore_into_the_running_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (keys_path, keys) = key_file(dir.path());
    let storage = Storage::start().await;
    let path = dir.path().join("marks.db");
    let backup = dir.path().join("backup.db");
    let store = format!("sqlite:{}", path.display());
    let gw = GatewayProcess::start_with_store(&storage.url, &store, &keys_path, &[]).await;
    assert_eq!(put(&gw, &keys, "aisle-1", 10).await, 200);
    online_backup(&path, &backup);
    assert_eq!(put(&gw, &keys, "aisle-1", 20).await, 200);
    online_backup(&backup, &path);
    assert_eq!(put(&gw, &keys, "aisle-1", 21).await, 503);
    readyz_becomes(&gw, 503, Duration::from_secs(5)).await;
    drop(gw);
    let (status, stderr) = common::gateway_refuses(&storage.url, &store, &keys_path, &[]);
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("older copy"), "{stderr}");
    assert_eq!(applied(&storage), [10, 20]);
}

/// A second gateway on the same file through a symbolic link is
/// refused as in use (the lock file is named from the file's real path), with or without an
/// era floor; through a hard link it is refused too (a marks file with more than one name),
/// and the refusal leaves no lock file behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_gateway_through_a_symlink_or_a_hard_link_fails_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let (keys_path, keys) = key_file(dir.path());
    let storage = Storage::start().await;
    let path = dir.path().join("a.db");
    let store = format!("sqlite:{}", path.display());
    let first = GatewayProcess::start_with_store(&storage.url, &store, &keys_path, &[]).await;
    assert_eq!(put(&first, &keys, "aisle-1", 10).await, 200);

    let symlink = dir.path().join("b.db");
    std::os::unix::fs::symlink(&path, &symlink).unwrap();
    let via_symlink = format!("sqlite:{}", symlink.display());
    for flags in [&[][..], &["--era-floor", "1"][..]] {
        let (status, stderr) =
            common::gateway_refuses(&storage.url, &via_symlink, &keys_path, flags);
        assert_eq!(status.code(), Some(1), "{stderr}");
        assert!(stderr.contains("in use by another process"), "{stderr}");
    }
    assert!(!dir.path().join("b.db.lock").exists());

    let hard_link = dir.path().join("c.db");
    std::fs::hard_link(&path, &hard_link).unwrap();
    let via_hard_link = format!("sqlite:{}", hard_link.display());
    for flags in [&[][..], &["--era-floor", "1"][..]] {
        let (status, stderr) =
            common::gateway_refuses(&storage.url, &via_hard_link, &keys_path, flags);
        assert_eq!(status.code(), Some(1), "{stderr}");
        assert!(stderr.contains("hard link"), "{stderr}");
    }
    assert!(!dir.path().join("c.db.lock").exists());

    assert_eq!(put(&first, &keys, "aisle-1", 11).await, 200);
    assert_eq!(put(&first, &keys, "aisle-1", 10).await, 409);
    assert_eq!(applied(&storage), [10, 11]);
}
