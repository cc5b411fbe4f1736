//! Who may call (docs/DESIGN.md §5.1 "Who may call"): bearer tokens checked against the token file
//! (`--auth-tokens`), or client certificates verified by the TLS handshake (`--tls-client-ca`)
//! naming a principal with a `cert` line; permissions per operation and resource-name prefix.
//! Off unless `--auth-tokens` is given; then every route but the operational ones needs a
//! principal.
//!
//! The table is swapped whole on reload (SIGHUP, or the file's modification time or length
//! changing), so a request sees either the old table or the new one; connections are not
//! touched, each request is judged by the table current when it arrives — and an acquire again
//! before its create transaction and whenever a reload happens while it waits
//! ([`Auth::changes`], `lease::Recheck`).

mod judge;
mod table;

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use axum::http::{header, HeaderMap};
use runtime::reload::{Outcome, Reloads};
use runtime::tls::PeerCertificate;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub(crate) use judge::{Judge, Peer, Target};
pub(crate) use table::{Op, Principal, Table};

use serde::{Deserialize, Serialize};

/// Which name of a verified client certificate is its principal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CertPrincipal {
    /// The subject's common name.
    #[default]
    Cn,
    /// The first DNS subject alternative name that has a `cert` line in the token file.
    Dns,
}

/// Why a request is not authenticated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unauthenticated {
    /// No `Authorization` header.
    Missing,
    /// An `Authorization` header that is not `Bearer TOKEN`.
    Malformed,
    /// A bearer token that is in no line of the token file.
    Unknown,
    /// A verified client certificate, no bearer token, and no `cert` line for any name the
    /// certificate gives.
    UnknownCertificate,
    /// Judged again after a reload, the credential names another principal than the one the
    /// request was made as.
    Replaced,
    /// A bearer token and a client certificate naming two different principals.
    Conflicting,
}

impl Unauthenticated {
    /// For the problem detail and audit lines.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Unauthenticated::Missing => "no Authorization header",
            Unauthenticated::Malformed => "the Authorization header is not `Bearer TOKEN`",
            Unauthenticated::Unknown => "unknown bearer token",
            Unauthenticated::UnknownCertificate => {
                "the client certificate names no principal of the token file's `cert` lines"
            }
            Unauthenticated::Conflicting => {
                "the bearer token and the client certificate name different principals"
            }
            Unauthenticated::Replaced => {
                "since the request arrived, the token file gives its credential to another principal"
            }
        }
    }
}

/// The current token table and where it comes from.
pub(crate) struct Auth {
    path: PathBuf,
    table: RwLock<Arc<Table>>,
    /// Marked changed on every reload that swapped the table.
    reloaded: tokio::sync::watch::Sender<()>,
    cert_name: CertPrincipal,
}

impl Auth {
    /// Loads the token file; an unusable file is refused (the proxy does not start). A file
    /// without principals is taken (nobody may call) but warned about. `cert_name` says which
    /// name of a client certificate is its principal.
    pub(crate) fn load(path: &Path, cert_name: CertPrincipal) -> Result<Self, String> {
        let table = Table::load(path)?;
        if table.len() == 0 {
            tracing::warn!(path = %path.display(), "the token file names no principal: every request that needs one is refused (401)");
        }
        tracing::info!(path = %path.display(), principals = table.len(), "token file loaded");
        Ok(Self {
            path: path.to_owned(),
            table: RwLock::new(Arc::new(table)),
            reloaded: tokio::sync::watch::Sender::new(()),
            cert_name,
        })
    }

    /// The principal of the request: the one its `Authorization: Bearer TOKEN` names, else
    /// the one its connection's verified client certificate names. Both given, they must name
    /// the same principal (a certificate naming none is then ignored).
    pub(crate) fn authenticate(
        &self,
        headers: &HeaderMap,
        peer: Option<&PeerCertificate>,
    ) -> Result<Arc<Principal>, Unauthenticated> {
        let by_certificate = peer.and_then(|peer| {
            let table = self.current();
            match self.cert_name {
                CertPrincipal::Cn => table.certificate(peer.common_name.as_deref()),
                CertPrincipal::Dns => table.certificate(peer.dns_names.iter().map(String::as_str)),
            }
        });
        if headers.get(header::AUTHORIZATION).is_none() {
            return match (peer, by_certificate) {
                (_, Some(principal)) => Ok(principal),
                (Some(_), None) => Err(Unauthenticated::UnknownCertificate),
                (None, None) => Err(Unauthenticated::Missing),
            };
        }
        let by_token = self.bearer(headers)?;
        match by_certificate {
            Some(p) if p.name != by_token.name => Err(Unauthenticated::Conflicting),
            _ => Ok(by_token),
        }
    }

    /// The principal the request's `Authorization: Bearer TOKEN` names.
    fn bearer(&self, headers: &HeaderMap) -> Result<Arc<Principal>, Unauthenticated> {
        let mut values = headers.get_all(header::AUTHORIZATION).iter();
        let value = values.next().ok_or(Unauthenticated::Missing)?;
        // Two credentials in one request: which one counts would be a guess.
        if values.next().is_some() {
            return Err(Unauthenticated::Malformed);
        }
        let token = value
            .to_str()
            .ok()
            .and_then(|v| {
                let (scheme, token) = v.split_once(' ')?;
                scheme
                    .eq_ignore_ascii_case("bearer")
                    .then_some(token.trim())
            })
            .filter(|t| !t.is_empty())
            .ok_or(Unauthenticated::Malformed)?;
        self.current()
            .authenticate(token)
            .ok_or(Unauthenticated::Unknown)
    }

    /// The principal whose bearer token is `token`, in the file in force (etcd's
    /// `Authenticate`, where the password is the token).
    pub(crate) fn principal_of_token(&self, token: &str) -> Option<Arc<Principal>> {
        self.current().authenticate(token)
    }

    /// Whether the principal named `name` may do `op` on every one of `resources`, in the file
    /// in force: for grants the service makes on a principal's behalf (a fleet's), judged
    /// whenever it decides, not at a request. A name with no line in the file may do nothing.
    pub(crate) fn named_may_all(&self, name: &str, op: Op, resources: &[String]) -> bool {
        let table = self.current();
        let principals = table.named(name);
        !principals.is_empty()
            && resources
                .iter()
                .all(|r| principals.iter().any(|p| p.may(op, r)))
    }

    fn current(&self) -> Arc<Table> {
        // A poisoned lock only means a reload panicked mid-swap of an Arc: the value is whole.
        self.table
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Reads the file again; a file that does not load (it does not parse, or its last line
    /// is cut) leaves the current table in force, and so does a file without principals while
    /// the current table has some: that is what a file emptied mid-rewrite looks like, and
    /// taking it would lock every principal out.
    fn reload(&self, why: &'static str) -> Outcome {
        let loaded = Table::load(&self.path).and_then(|table| {
            if table.len() == 0 && self.current().len() > 0 {
                Err(format!(
                    "token file {}: it names no principal (emptied, or being rewritten?); \
                     to lock everyone out, leave one line whose token nobody has",
                    self.path.display()
                ))
            } else {
                Ok(table)
            }
        });
        match loaded {
            Ok(table) => {
                tracing::info!(path = %self.path.display(), principals = table.len(), why, "token file reloaded");
                *self
                    .table
                    .write()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(table);
                // After the swap: whoever wakes and judges again sees the new table.
                self.reloaded.send_replace(());
                Outcome::Loaded
            }
            Err(e) => {
                tracing::error!(error = %e, why, "token file NOT reloaded; the previous table stays in force");
                Outcome::Refused
            }
        }
    }

    /// Marked changed whenever a reload has put another table in force (changes before this
    /// call count as seen).
    pub(crate) fn changes(&self) -> tokio::sync::watch::Receiver<()> {
        self.reloaded.subscribe()
    }

    /// Reloads on SIGHUP and when the file changes, until `cancel`; the task is `tracker`'s.
    /// Each reload is counted as `file="auth-tokens"`.
    pub(crate) fn watch(
        self: &Arc<Self>,
        reloads: &Reloads,
        tracker: &TaskTracker,
        cancel: CancellationToken,
    ) {
        let auth = self.clone();
        let counted = reloads.of("auth-tokens");
        runtime::reload::on_change(
            vec![self.path.clone()],
            counted,
            tracker,
            cancel,
            move |why| auth.reload(why),
        );
    }
}
