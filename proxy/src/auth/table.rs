//! The token file: who the principals are, how each proves it (the SHA-256 of a bearer token,
//! or `cert`: a client certificate naming it, verified by the TLS handshake), and what each may
//! do (operations on resource-name prefixes).
//!
//! ```text
//! # PRINCIPAL  SHA256HEX-OF-TOKEN | cert                                         PERM[,PERM…]
//! billing      9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08  acquire:billing-,read:*
//! robot-7      cert                                                              acquire:aisle-,forward:aisle-
//! ```

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

pub(crate) use crate::error::Op;

impl Op {
    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "acquire" => Op::Acquire,
            "read" => Op::Read,
            "forward" => Op::Forward,
            "v3" => Op::V3,
            _ => return None,
        })
    }
}

/// One `OP:PREFIX`; an empty prefix (written `*`) covers every resource.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Permission {
    op: Op,
    prefix: String,
}

/// An authenticated caller and what it may do.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Principal {
    /// The name from the token file: recorded in grants and audit lines.
    pub(crate) name: String,
    permissions: Vec<Permission>,
}

impl Principal {
    /// Whether the principal may do `op` on `resource`.
    pub(crate) fn may(&self, op: Op, resource: &str) -> bool {
        self.permissions
            .iter()
            .any(|p| p.op == op && resource.starts_with(&p.prefix))
    }

    /// Whether the principal may do `op` on at least one resource.
    pub(crate) fn may_any(&self, op: Op) -> bool {
        self.permissions.iter().any(|p| p.op == op)
    }

    /// The resource-name prefixes the principal may do `op` on (`""`: every resource).
    pub(crate) fn prefixes(&self, op: Op) -> impl Iterator<Item = &str> {
        self.permissions
            .iter()
            .filter(move |p| p.op == op)
            .map(|p| p.prefix.as_str())
    }
}

/// How a line's principal proves who it is.
enum Credential {
    /// A bearer token with this SHA-256.
    Token([u8; 32]),
    /// A client certificate that names it (mTLS).
    Certificate,
}

struct Entry {
    credential: Credential,
    principal: Arc<Principal>,
}

/// The parsed token file.
pub(crate) struct Table {
    entries: Vec<Entry>,
}

impl fmt::Debug for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Names only: the hashes stay out of logs.
        f.debug_list()
            .entries(self.entries.iter().map(|e| &e.principal.name))
            .finish()
    }
}

impl Table {
    /// Reads and parses the file at `path`. A file whose last line has no newline is refused:
    /// it may be cut short mid-write, and a permission cut short (`acquire:a` of
    /// `acquire:a-`) is a wider one.
    pub(crate) fn load(path: &Path) -> Result<Self, String> {
        let text = runtime::files::read_config_text(path, MAX_FILE_BYTES)
            .map_err(|e| format!("cannot read the token file {}: {e}", path.display()))?;
        Self::parse(&text).map_err(|e| format!("token file {}: {e}", path.display()))
    }

    /// Parses a token file: every line is checked, so one bad line refuses the whole file
    /// (a reload that fails keeps the previous table).
    pub(crate) fn parse(text: &str) -> Result<Self, String> {
        let mut entries: Vec<Entry> = Vec::new();
        for (n, raw) in text.lines().enumerate() {
            let line = raw.split('#').next().unwrap_or_default().trim();
            if line.is_empty() {
                continue;
            }
            let at = |m: String| format!("line {}: {m}", n + 1);
            let fields: Vec<&str> = line.split_whitespace().collect();
            let [name, credential, perms] = fields[..] else {
                return Err(at(format!(
                    "expected `PRINCIPAL SHA256HEX|cert PERM[,PERM…]`, found {} fields",
                    fields.len()
                )));
            };
            if !valid_name(name) {
                return Err(at(format!(
                    "the principal name must be 1 to {MAX_NAME_BYTES} of A-Z a-z 0-9 . _ - \
                     (it is a key segment of the principal's /v3 namespace)"
                )));
            }
            let credential = if credential == "cert" {
                Credential::Certificate
            } else {
                Credential::Token(parse_hash(credential).ok_or_else(|| {
                    at("the token hash must be 64 hexadecimal digits (`printf %s \"$TOKEN\" | sha256sum`), or `cert`".into())
                })?)
            };
            let permissions = perms
                .split(',')
                .map(parse_permission)
                .collect::<Result<Vec<_>, _>>()
                .map_err(at)?;
            // A principal may have several lines (tokens), e.g. an old and a new one while
            // its clients switch; grants are bound to the name, so either token owns them.
            // Its certificate line is one per principal: a second would make its permissions
            // depend on which line came first.
            let taken = entries.iter().any(|e| match (&e.credential, &credential) {
                (Credential::Token(a), Credential::Token(b)) => bool::from(a.ct_eq(b)),
                (Credential::Certificate, Credential::Certificate) => e.principal.name == name,
                _ => false,
            });
            if taken {
                return Err(at(match credential {
                    Credential::Token(_) => "two principals share one token".into(),
                    Credential::Certificate => format!("a second `cert` line for `{name}`"),
                }));
            }
            entries.push(Entry {
                credential,
                principal: Arc::new(Principal {
                    name: name.to_owned(),
                    permissions,
                }),
            });
        }
        Ok(Self { entries })
    }

    /// The principal whose token is `token`. Every entry is compared, in constant time, so the
    /// answer's timing tells nothing about which hash (or how much of one) matched.
    pub(crate) fn authenticate(&self, token: &str) -> Option<Arc<Principal>> {
        let presented: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let mut found = None;
        for entry in &self.entries {
            if let Credential::Token(hash) = &entry.credential {
                if bool::from(hash.ct_eq(&presented)) {
                    found = Some(entry.principal.clone());
                }
            }
        }
        found
    }

    /// The first of `names` (from a verified client certificate) that has a `cert` line.
    pub(crate) fn certificate<'a>(
        &self,
        names: impl IntoIterator<Item = &'a str>,
    ) -> Option<Arc<Principal>> {
        names.into_iter().find_map(|name| {
            self.entries.iter().find_map(|e| {
                (matches!(e.credential, Credential::Certificate) && e.principal.name == name)
                    .then(|| e.principal.clone())
            })
        })
    }

    /// The lines of the principal named `name` (one per token, and its certificate's).
    pub(crate) fn named(&self, name: &str) -> Vec<Arc<Principal>> {
        self.entries
            .iter()
            .filter(|e| e.principal.name == name)
            .map(|e| e.principal.clone())
            .collect()
    }

    /// How many principals the table has.
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }
}

/// The largest token file read (some 100,000 lines).
const MAX_FILE_BYTES: u64 = 16 << 20;

/// The longest principal name.
const MAX_NAME_BYTES: usize = 64;

/// Whether `name` can be a principal: it becomes a key segment (`{--v3-namespace}{name}/`) and
/// a part of lock fencing domains, so no `/`, nothing a key or a log would show ambiguously;
/// and `.`/`..` are refused so that no name reads like a path step.
fn valid_name(name: &str) -> bool {
    (1..=MAX_NAME_BYTES).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        && name != "."
        && name != ".."
}

fn parse_hash(hex_digits: &str) -> Option<[u8; 32]> {
    if hex_digits.len() != 64 {
        return None;
    }
    let mut hash = [0; 32];
    hex::decode_to_slice(hex_digits.to_ascii_lowercase(), &mut hash).ok()?;
    Some(hash)
}

fn parse_permission(perm: &str) -> Result<Permission, String> {
    let (op, prefix) = perm
        .split_once(':')
        .ok_or_else(|| format!("permission `{perm}` is not `OP:PREFIX`"))?;
    let op = Op::parse(op).ok_or_else(|| {
        format!("permission `{perm}`: the operation must be acquire, read, forward or v3")
    })?;
    let prefix = match prefix {
        "*" => String::new(),
        "" => {
            return Err(format!(
                "permission `{perm}`: empty prefix (use `*` for all)"
            ))
        }
        p if crate::lease::validate::resource_prefix(p).is_err() || p.contains('*') => {
            return Err(format!(
                "permission `{perm}`: `{p}` is not a resource-name prefix"
            ))
        }
        p => p.to_owned(),
    };
    if op == Op::V3 && !prefix.is_empty() {
        // /v3 keys are not resource names: `v3:*` gives the principal the /v3 API in a
        // namespace of its own (`{--v3-namespace}{principal}/`), and a prefix that looked like a
        // further limit but was not would be worse than none.
        return Err(format!(
            "permission `{perm}`: /v3 is all or nothing (in the principal's own namespace), \
             write `v3:*`"
        ));
    }
    Ok(Permission { op, prefix })
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALICE: &str = "alice-token";

    fn hash(token: &str) -> String {
        hex::encode(Sha256::digest(token.as_bytes()))
    }

    #[test]
    fn a_file_parses_and_authenticates_by_hash() {
        let text = format!(
            "# comment\n\n  alice {} acquire:aisle-,read:*  # trailing\nbob {} read:aisle-\n",
            hash(ALICE),
            hash("bob-token").to_uppercase()
        );
        let table = Table::parse(&text).unwrap();
        assert_eq!(table.len(), 2);
        let alice = table.authenticate(ALICE).unwrap();
        assert_eq!(alice.name, "alice");
        assert!(alice.may(Op::Acquire, "aisle-1"));
        assert!(!alice.may(Op::Acquire, "dock-1"));
        assert!(alice.may(Op::Read, "dock-1"));
        assert!(!alice.may(Op::Forward, "aisle-1"));
        assert!(!alice.may_any(Op::V3));
        assert_eq!(table.authenticate("bob-token").unwrap().name, "bob");
        assert!(table.authenticate("nobody").is_none());
        assert!(table.authenticate("").is_none());
    }

    #[test]
    fn bad_lines_are_refused_with_their_number() {
        let h = hash(ALICE);
        for bad in [
            "alice".to_owned(),
            format!("alice {h}"),
            format!("alice {h} read:* extra"),
            "alice abc read:*".to_owned(),
            format!("alice {}zz read:*", &h[..62]),
            format!("alice {h} write:*"),
            format!("alice {h} read"),
            format!("alice {h} read:"),
            format!("alice {h} read:a*"),
            format!("alice {h} read:a/b"),
            format!("alice {h} v3:team-"),
            format!("alice {h} read:*\nbob {h} read:*"),
            format!("al/ice {h} read:*"),
            format!("al ice {h} read:*"),
            format!("{} {h} read:*", "a".repeat(65)),
            format!("alicé {h} read:*"),
            format!("a:b {h} read:*"),
            format!(".. {h} read:*"),
            "alice cert read:*\nalice cert acquire:*".to_owned(),
            "alice certs read:*".to_owned(),
        ] {
            let err = Table::parse(&format!("# ok\n{bad}\n")).unwrap_err();
            // The bad line is the last one (the first is a comment).
            let want = format!("line {}:", 1 + bad.lines().count());
            assert!(err.starts_with(&want), "{bad:?}: {err}");
        }
        assert_eq!(Table::parse("").unwrap().len(), 0);
        let longest = format!(
            "{} {h} read:*\nA.b_C-9 {} read:*",
            "a".repeat(64),
            hash("x")
        );
        assert_eq!(Table::parse(&longest).unwrap().len(), 2);
    }

    #[test]
    fn a_principal_may_have_several_tokens() {
        let text = format!(
            "alice {} acquire:aisle-\nalice {} read:*\n",
            hash(ALICE),
            hash("alice-next")
        );
        let table = Table::parse(&text).unwrap();
        let old = table.authenticate(ALICE).unwrap();
        let new = table.authenticate("alice-next").unwrap();
        assert_eq!((old.name.as_str(), new.name.as_str()), ("alice", "alice"));
        // Each line's permissions go with its token.
        assert!(old.may(Op::Acquire, "aisle-1") && !old.may(Op::Read, "aisle-1"));
        assert!(new.may(Op::Read, "aisle-1") && !new.may(Op::Acquire, "aisle-1"));
    }

    #[test]
    fn certificate_lines_name_principals_without_a_token() {
        let text = format!(
            "robot-7 cert acquire:aisle-\nrobot-7 {} read:*\nbob {} read:*\n",
            hash(ALICE),
            hash("bob-token")
        );
        let table = Table::parse(&text).unwrap();
        let robot = table.certificate(["robot-7"]).unwrap();
        assert!(robot.may(Op::Acquire, "aisle-1") && !robot.may(Op::Read, "aisle-1"));
        // The first name with a `cert` line; a principal with only tokens is no certificate's.
        assert_eq!(
            table
                .certificate(["nobody", "robot-7"])
                .map(|p| p.name.clone()),
            Some("robot-7".to_owned())
        );
        assert!(table.certificate(["bob"]).is_none());
        assert!(table.certificate([]).is_none());
        // `cert` is not a token: presenting the word authenticates nobody.
        assert!(table.authenticate("cert").is_none());
        assert_eq!(table.authenticate(ALICE).unwrap().name, "robot-7");
    }
}
