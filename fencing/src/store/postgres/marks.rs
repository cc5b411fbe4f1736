//! Which set of marks a store uses, and why never a second one of its deployment.
//!
//! One resource must have one mark. A database can hold several sets of the store's tables
//! (`fence_marks` and its siblings): fence-gateway's, created where its `search_path` pointed; the
//! in-database package's, in its schema (kept by `pg uninstall`); another deployment's; or one a
//! role with `CREATE` on a schema planted to be found first. A store that used a set other than
//! its deployment's would admit writes against marks lower than the real ones.
//!
//! So every set carries a **stamp**, its table comment: `lease-proxy fencing marks` and the key
//! tags of the deployment that made or uses it ([`Keyring::marks_tags`]: a key shared is a
//! deployment shared), ` (in-database package)` for the package's, ` (no keys)` for one a store
//! made without a key file. At start, a store takes the set its `search_path` resolves (all of
//! it in one schema, or none of it: then it creates one there) and refuses to start if any other
//! set in the database could be its deployment's:
//!
//! - one stamped with one of its key tags: this deployment's marks elsewhere;
//! - the package's (beside `package_version`, or stamped so), unless stamped with key tags none
//!   of which is the store's (another deployment's package);
//! - one without a stamp (made before stamps): nothing tells whose it is. It is accounted for
//!   once stamped — by its own gateway's next start, by `pg sync-keys` for the package's — or
//!   dropped.
//!
//! Only sets whose owner could have made real marks count: the store's role (or one it is a
//! member of), a superuser, the owner of the set's schema. One a tenant made where it may create
//! is nobody's marks and does not stop a store (it is never used: the store's set is the one its
//! search_path resolves, and if that is the planted one, the real set elsewhere refuses it).
//!
//! Sets stamped `(no keys)` or with other key tags are other deployments'. A store made
//! without keys (the library's [`PostgresStore::connect`]) cannot compare tags: it refuses
//! beside the package's and unstamped sets only.
//!
//! A store that owns its set stamps it with its tags (merged with the ones there).
//!
//! [`Keyring::marks_tags`]: crate::Keyring::marks_tags
//! [`PostgresStore::connect`]: super::PostgresStore::connect

use tokio_postgres::Transaction;

use super::err;
use crate::store::StoreError;

/// The store's tables, created (with its stamp) where none resolves.
pub(super) const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS fence_marks (
    resource text PRIMARY KEY,
    mark bytea NOT NULL CHECK (length(mark) = 16)
);
CREATE TABLE IF NOT EXISTS fence_inflight (
    id bigint PRIMARY KEY,
    resource text NOT NULL,
    token bytea NOT NULL CHECK (length(token) = 16),
    expires_at timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS fence_inflight_by_resource ON fence_inflight (resource, token);
";

/// The schema each of the store's objects resolves to on the session's search_path (NULL where
/// it does not), `fence_marks`'s oid, its stamp, and whether this role may re-stamp it.
/// (`fence_probe` is the package's; the store does not use it.)
const RESOLVED: &str = "SELECT \
    (SELECT c.relnamespace::regnamespace::text FROM pg_catalog.pg_class AS c \
     WHERE c.oid = pg_catalog.to_regclass('fence_marks')), \
    (SELECT c.relnamespace::regnamespace::text FROM pg_catalog.pg_class AS c \
     WHERE c.oid = pg_catalog.to_regclass('fence_inflight')), \
    (SELECT c.relnamespace::regnamespace::text FROM pg_catalog.pg_class AS c \
     WHERE c.oid = pg_catalog.to_regclass('fence_inflight_by_resource')), \
    pg_catalog.to_regclass('fence_marks')::oid, \
    pg_catalog.obj_description(pg_catalog.to_regclass('fence_marks'), 'pg_class'), \
    (SELECT pg_catalog.pg_has_role(c.relowner, 'USAGE') FROM pg_catalog.pg_class AS c \
     WHERE c.oid = pg_catalog.to_regclass('fence_marks'))";

/// Every other relation named `fence_marks` in the database that could hold real marks
/// (temporary schemas aside): its schema, owner, stamp, and whether the package's
/// `package_version` is beside it. Only one owned by this role (or a role it is a member of), a
/// superuser, or its schema's owner: a table a tenant made where it may create (`public`) is
/// nobody's marks — its owner could write any mark into it — and must not stop a gateway.
const OTHERS: &str = "SELECT n.nspname::text, c.relowner::regrole::text, \
    pg_catalog.obj_description(c.oid, 'pg_class'), \
    EXISTS (SELECT FROM pg_catalog.pg_class AS v WHERE v.relnamespace = n.oid \
            AND v.relname = 'package_version') \
    FROM pg_catalog.pg_class AS c JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace \
    WHERE c.relname = 'fence_marks' AND c.oid IS DISTINCT FROM $1 \
      AND (pg_catalog.pg_has_role(c.relowner, 'MEMBER') OR c.relowner = n.nspowner \
           OR (SELECT r.rolsuper FROM pg_catalog.pg_roles AS r WHERE r.oid = c.relowner)) \
      AND n.nspname NOT LIKE 'pg\\_temp\\_%' AND n.nspname NOT LIKE 'pg\\_toast\\_temp\\_%' \
    ORDER BY 1";

const PREFIX: &str = "lease-proxy fencing marks";
const PACKAGE: &str = " (in-database package)";
const NO_KEYS: &str = " (no keys)";
/// At most this many key tags are kept in a stamp (the newest first).
const MAX_TAGS: usize = 16;

/// A set of marks' stamp (see the module docs).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Stamp {
    /// The in-database package's.
    pub(crate) package: bool,
    /// The key tags of the deployment(s) that use it; empty: made without keys.
    pub(crate) tags: Vec<String>,
}

impl Stamp {
    /// The stamp in a table comment; `None` if it is not one.
    pub(crate) fn parse(comment: Option<&str>) -> Option<Self> {
        let rest = comment?.strip_prefix(PREFIX)?;
        let (package, rest) = match rest.strip_prefix(PACKAGE) {
            Some(rest) => (true, rest),
            None => (false, rest),
        };
        let rest = rest.strip_prefix(NO_KEYS).unwrap_or(rest);
        let tags = match rest.strip_prefix(": ") {
            Some(list) => list
                .split(' ')
                .filter(|t| !t.is_empty())
                .map(str::to_owned)
                .collect(),
            None if rest.is_empty() => Vec::new(),
            None => return None,
        };
        Some(Self { package, tags })
    }

    /// The comment that carries it.
    pub(crate) fn render(&self) -> String {
        let package = if self.package { PACKAGE } else { "" };
        if self.tags.is_empty() {
            format!("{PREFIX}{package}{NO_KEYS}")
        } else {
            format!("{PREFIX}{package}: {}", self.tags.join(" "))
        }
    }

    /// `ours` first, then the tags already there, each once, at most [`MAX_TAGS`].
    pub(crate) fn merged(previous: Option<&Self>, ours: &[String], package: bool) -> Self {
        let mut tags: Vec<String> = Vec::new();
        for tag in ours
            .iter()
            .chain(previous.map(|p| p.tags.as_slice()).unwrap_or(&[]))
        {
            if !tags.contains(tag) && tags.len() < MAX_TAGS {
                tags.push(tag.clone());
            }
        }
        Self {
            package: package || previous.is_some_and(|p| p.package),
            tags,
        }
    }

    fn shares_a_tag(&self, ours: &[String]) -> bool {
        self.tags.iter().any(|t| ours.contains(t))
    }
}

/// `COMMENT ON TABLE {table} IS …` for `stamp`.
pub(crate) fn stamp_statement(table: &str, stamp: &Stamp) -> String {
    format!(
        "COMMENT ON TABLE {table} IS '{}'",
        stamp.render().replace('\'', "''")
    )
}

/// Finds (or creates) the set of tables the session's search_path resolves, refuses if another
/// set in the database could be this deployment's (module docs), and stamps the set if this
/// role owns it. `tags`: the deployment's key tags, `None` for a store without keys.
pub(super) async fn prepare(
    tx: &Transaction<'_>,
    tags: Option<&[String]>,
) -> Result<(), StoreError> {
    let row = tx.query_one(RESOLVED, &[]).await.map_err(err)?;
    let schemas: Vec<Option<String>> = (0..3).map(|i| row.get(i)).collect();
    let marks: Option<u32> = row.get(3);
    let stamp = Stamp::parse(row.get::<_, Option<&str>>(4));
    let owned: Option<bool> = row.get(5);
    let first = schemas[0].clone();
    if schemas.iter().any(|s| *s != first) {
        let names = [
            "fence_marks",
            "fence_inflight",
            "fence_inflight_by_resource",
        ];
        let found: Vec<String> = names
            .iter()
            .zip(&schemas)
            .map(|(n, s)| format!("{n} in {}", s.as_deref().unwrap_or("no schema")))
            .collect();
        return Err(StoreError(format!(
            "the store's tables do not all resolve in one schema on this role's search_path \
             ({}): a table of the same name in a schema earlier on the path would take the \
             writes; fix the search_path (or drop the stray tables)",
            found.join(", ")
        )));
    }
    for row in tx.query(OTHERS, &[&marks]).await.map_err(err)? {
        let (schema, owner): (String, String) = (row.get(0), row.get(1));
        let other = Stamp::parse(row.get::<_, Option<&str>>(2));
        let package = row.get::<_, bool>(3) || other.as_ref().is_some_and(|s| s.package);
        if let Some(why) = unaccounted(other.as_ref(), package, tags) {
            return Err(StoreError(format!(
                "fence_marks in schema {schema} (owner {owner}) {why}; this store would use {}: \
                 point it at that set (connect with search_path={schema}, e.g. the URL option \
                 `options=-csearch_path%3D{schema}`, or `fence-gateway pg install \
                 --gateway-role ROLE`), or drop the other set if it is no deployment's — never \
                 start a second set of marks",
                first
                    .as_deref()
                    .map_or("a new, empty set".to_owned(), |s| format!(
                        "the set in schema {s}"
                    ))
            )));
        }
    }
    let ours = tags.unwrap_or(&[]);
    match first {
        None => {
            tx.batch_execute(SCHEMA).await.map_err(err)?;
            let stamp = Stamp::merged(None, ours, false);
            tx.batch_execute(&stamp_statement("fence_marks", &stamp))
                .await
                .map_err(err)?;
        }
        Some(_) if owned == Some(true) && tags.is_some() => {
            let package = stamp.as_ref().is_some_and(|s| s.package);
            let wanted = Stamp::merged(stamp.as_ref(), ours, package);
            if stamp.as_ref() != Some(&wanted) {
                tx.batch_execute(&stamp_statement("fence_marks", &wanted))
                    .await
                    .map_err(err)?;
            }
        }
        Some(_) => {}
    }
    Ok(())
}

/// Why another set could be this deployment's, or `None` if it is accounted for.
fn unaccounted(
    other: Option<&Stamp>,
    package: bool,
    tags: Option<&[String]>,
) -> Option<&'static str> {
    match (other, tags) {
        (None, _) if package => Some("is the in-database package's"),
        (None, _) => Some("has no stamp (made before stamps, or by another role): nothing tells whose marks it holds"),
        (Some(s), Some(ours)) if s.shares_a_tag(ours) => Some("is stamped with one of this deployment's keys"),
        (Some(s), Some(_)) if package && s.tags.is_empty() => {
            Some("is the in-database package's, whose keys it does not name (run `fence-gateway pg sync-keys`)")
        }
        (Some(_), Some(_)) => None,
        (Some(_), None) if package => Some("is the in-database package's"),
        (Some(_), None) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamps_round_trip_and_merge() {
        let keyed = Stamp {
            package: false,
            tags: vec!["k1:00".into(), "k2:11".into()],
        };
        for stamp in [
            keyed.clone(),
            Stamp::default(),
            Stamp {
                package: true,
                tags: vec![],
            },
            Stamp {
                package: true,
                tags: vec!["k1:00".into()],
            },
        ] {
            assert_eq!(Stamp::parse(Some(&stamp.render())), Some(stamp.clone()));
        }
        assert_eq!(Stamp::parse(Some("a table of marks")), None);
        assert_eq!(Stamp::parse(None), None);
        let merged = Stamp::merged(Some(&keyed), &["k3:22".into(), "k1:00".into()], false);
        assert_eq!(merged.tags, ["k3:22", "k1:00", "k2:11"]);
        let many: Vec<String> = (0..40).map(|i| format!("k{i}:00")).collect();
        assert_eq!(Stamp::merged(None, &many, true).tags.len(), MAX_TAGS);
        assert!(stamp_statement("t", &Stamp::default()).ends_with("(no keys)'"));
    }

    #[test]
    fn only_other_deployments_sets_are_accounted_for() {
        let ours = vec!["k1:00".to_owned()];
        let other = Stamp {
            package: false,
            tags: vec!["k9:99".into()],
        };
        let mine = Stamp {
            package: false,
            tags: vec!["k1:00".into()],
        };
        let keyless = Stamp::default();
        assert!(unaccounted(Some(&other), false, Some(&ours)).is_none());
        assert!(unaccounted(Some(&other), true, Some(&ours)).is_none());
        assert!(unaccounted(Some(&keyless), false, Some(&ours)).is_none());
        assert!(unaccounted(Some(&mine), false, Some(&ours)).is_some());
        assert!(unaccounted(Some(&keyless), true, Some(&ours)).is_some());
        assert!(unaccounted(None, false, Some(&ours)).is_some());
        assert!(unaccounted(None, false, None).is_some());
        assert!(unaccounted(Some(&other), true, None).is_some());
        assert!(unaccounted(Some(&mine), false, None).is_none());
    }
}
