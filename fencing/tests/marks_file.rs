//! The fence-gateway binary on a SQLite marks file: readiness on a full disk.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{key_file, GatewayProcess, RecordingStorage};
use fencing::{Keyring, Token};

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
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let status = reqwest::get(format!("{}/readyz", gw.url))
            .await
            .map_or(0, |r| r.status().as_u16());
        if status == want {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "/readyz still {status}, not {want}, after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// F4: on a full disk every raise fails, and `/readyz` says so; once there is room again it is
/// ready again and raises go through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_is_503_while_the_disk_is_full() {
    let dir = tempfile::tempdir().unwrap();
    let Some(disk) = Tmpfs::mount(&dir.path().join("disk"), "2m") else {
        eprintln!("SKIPPED: cannot mount a tmpfs here (needs root with CAP_SYS_ADMIN)");
        return;
    };
    let (keys_path, keys) = key_file(dir.path());
    let storage = RecordingStorage::start().await;
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
