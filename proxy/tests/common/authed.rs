//! One etcd with its own authentication on (`root`, and `norole`, a user without roles) and
//! the token file of proxies in front of it (calling etcd as `root`, with `--auth-tokens` and an
//! audit log): for the tests of what a hostile tenant tries on the etcd API.

use std::path::PathBuf;

use etcd_client::{Client, ConnectOptions};

use super::{token_line, Etcd, Proxy};

pub const ROOT_PASSWORD: &str = "root-password-5e1f";
pub const NOROLE_PASSWORD: &str = "norole-password-77";
pub const ACME: &str = "acme-token-4c3b2a";
pub const OTHER: &str = "other-token-8d7e6f";
pub const READER: &str = "reader-token-1a2b3c";
pub const DOOMED: &str = "doomed-token-9f8e7d";

/// The one etcd (authentication on: `root`, and `norole`, a user without roles) and the files
/// every proxy shares.
pub struct World {
    pub etcd: Etcd,
    pub dir: tempfile::TempDir,
    pub tokens: PathBuf,
    password: PathBuf,
}

impl World {
    pub async fn new() -> Self {
        let etcd = Etcd::single().await;
        let mut c = etcd.client().await;
        c.user_add("root", ROOT_PASSWORD, None).await.unwrap();
        c.user_grant_role("root", "root").await.unwrap();
        c.user_add("norole", NOROLE_PASSWORD, None).await.unwrap();
        c.auth_enable().await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let tokens = dir.path().join("tokens");
        std::fs::write(&tokens, Self::token_file(true)).unwrap();
        let password = dir.path().join("etcd-password");
        std::fs::write(&password, ROOT_PASSWORD).unwrap();
        Self {
            etcd,
            dir,
            tokens,
            password,
        }
    }

    pub fn token_file(with_doomed: bool) -> String {
        let mut file = token_line("acme", ACME, "v3:*")
            + &token_line("other", OTHER, "v3:*")
            + &token_line("reader", READER, "read:*");
        if with_doomed {
            file += &token_line("doomed", DOOMED, "v3:*");
        }
        file
    }

    /// A proxy in front of the etcd, as `root`, with the token file and an audit log.
    pub async fn proxy(&self, tweak: impl FnOnce(&mut lease_proxy::Config)) -> Proxy {
        let (tokens, password, audit) =
            (self.tokens.clone(), self.password.clone(), self.audit_log());
        Proxy::start(self.etcd.endpoints(), |c| {
            c.etcd_user = Some("root".into());
            c.etcd_password_file = Some(password);
            c.auth_tokens = Some(tokens);
            c.audit_log = Some(audit);
            tweak(c);
        })
        .await
    }

    pub fn audit_log(&self) -> PathBuf {
        self.dir.path().join("audit.jsonl")
    }

    /// etcd itself, as `root`.
    pub async fn root(&self) -> Client {
        let options = ConnectOptions::new().with_user("root", ROOT_PASSWORD);
        Client::connect(self.etcd.endpoints(), Some(options))
            .await
            .unwrap()
    }
}
