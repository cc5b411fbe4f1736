//! `pg uninstall` and `pg sync-keys`: removing the package (its marks stay) and replacing its
//! keys.

use std::time::Duration;

use tokio_postgres::Transaction;

use super::session::{begin, connect, in_slices};
use super::{check_schema, db, installed_version, PackageError};
use crate::store::{stamp_statement, Stamp};
use crate::Keyring;

/// What an uninstall removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Uninstalled {
    /// The tables that were protected (their triggers are gone with the package).
    pub unprotected: Vec<String>,
}

/// Removes the package's functions (and with them the triggers of protected tables, which
/// needs `force` if there are any, and its event trigger), its keys, remembered verdicts,
/// settings and version table. The marks and registrations stay, stamped as the package's: fence-gateways may share
/// them, and a mark must never go down.
///
/// Dropping waits for the transactions that admitted with the package (they read its keys) and
/// for those writing protected tables; meanwhile every new admit would queue behind the drop. So
/// it is tried in slices of a fraction of a second, each giving way to the sessions queued
/// behind it, until `wait` has passed; then it fails naming the sessions in the way.
pub async fn uninstall(
    url: &str,
    schema: &str,
    force: bool,
    wait: Duration,
) -> Result<Uninstalled, PackageError> {
    check_schema(schema)?;
    let mut client = connect(url).await?;
    let tx = client.transaction().await.map_err(db)?;
    let deadline = begin(&tx, schema, wait).await?;
    if installed_version(&tx, schema).await? == 0 {
        return Err(PackageError::Refused(format!(
            "no fencing package in schema {schema}"
        )));
    }
    let rows = tx
        .query(
            "SELECT DISTINCT t.tgrelid::regclass::text FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid \
             JOIN pg_namespace n ON n.oid = p.pronamespace \
             WHERE n.nspname = $1 AND p.proname IN ('row_guard', 'refuse_truncate') ORDER BY 1",
            &[&schema],
        )
        .await
        .map_err(db)?;
    let unprotected: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
    if !unprotected.is_empty() && !force {
        return Err(PackageError::Refused(format!(
            "tables {unprotected:?} are protected: unprotect them first, or pass --force to drop their triggers"
        )));
    }
    in_slices(&tx, deadline, schema, || drop_package(&tx, schema)).await?;
    tx.commit().await.map_err(db)?;
    Ok(Uninstalled { unprotected })
}

async fn drop_package(tx: &Transaction<'_>, schema: &str) -> Result<(), PackageError> {
    // The keys, settings and remembered verdicts first: from then on no admit starts (one of a
    // remembered token reads only the verdicts), and the drops below wait only for the
    // transactions already under way.
    tx.batch_execute(&format!(
        "LOCK TABLE {schema}.keys, {schema}.settings, {schema}.verdicts IN ACCESS EXCLUSIVE MODE"
    ))
    .await
    .map_err(db)?;
    let functions: Vec<String> = tx
        .query(
            "SELECT p.oid::regprocedure::text FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace \
             LEFT JOIN pg_depend d ON d.objid = p.oid AND d.deptype = 'e' \
             WHERE n.nspname = $1 AND d.objid IS NULL",
            &[&schema],
        )
        .await
        .map_err(db)?
        .iter()
        .map(|r| r.get(0))
        .collect();
    for function in functions {
        tx.batch_execute(&format!("DROP FUNCTION IF EXISTS {function} CASCADE"))
            .await
            .map_err(db)?;
    }
    tx.batch_execute(&format!(
        "DROP TABLE {schema}.verdicts, {schema}.keys, {schema}.settings, {schema}.package_version"
    ))
    .await
    .map_err(db)
}

/// Replaces the package's verification keys with the key file's, whole, in one transaction:
/// a key id no longer in the file stops verifying at its commit, and every remembered verdict
/// goes with the key rows (each token is verified again under the keys now in force). The file is parsed exactly as
/// the proxy and the gateway parse it, before the database is contacted, so a malformed file
/// changes nothing. Stamps the package's marks with the keys' tags (as fence-gateway stamps its
/// own), so that gateways recognise them as this deployment's wherever they are. Returns the key
/// ids now in force, the signing key first. Waits at most `wait` for the package's lock.
pub async fn sync_keys(
    url: &str,
    schema: &str,
    key_file: &std::path::Path,
    wait: Duration,
) -> Result<Vec<String>, PackageError> {
    check_schema(schema)?;
    let ring = Keyring::load(key_file)?;
    let (kids, secrets): (Vec<String>, Vec<Vec<u8>>) = ring
        .secrets()
        .map(|(id, secret)| (id.as_str().to_owned(), secret.to_vec()))
        .unzip();
    let mut client = connect(url).await?;
    let tx = client.transaction().await.map_err(db)?;
    let deadline = begin(&tx, schema, wait).await?;
    if installed_version(&tx, schema).await? == 0 {
        return Err(PackageError::Refused(format!(
            "no fencing package in schema {schema}: run `fence-gateway pg install` first"
        )));
    }
    let tags = ring.marks_tags();
    in_slices(&tx, deadline, schema, || async {
        tx.execute(
            &format!("SELECT {schema}.replace_keys($1, $2)"),
            &[&kids, &secrets],
        )
        .await
        .map_err(db)?;
        stamp(&tx, schema, &tags).await
    })
    .await?;
    tx.commit().await.map_err(db)?;
    Ok(kids)
}

/// Stamps `{schema}.fence_marks` as the package's, with `tags` (the key file's) first, if it is
/// not stamped so already.
pub(super) async fn stamp(
    tx: &Transaction<'_>,
    schema: &str,
    tags: &[String],
) -> Result<(), PackageError> {
    let comment: Option<String> = tx
        .query_one(
            "SELECT pg_catalog.obj_description(pg_catalog.to_regclass($1), 'pg_class')",
            &[&format!("{schema}.fence_marks")],
        )
        .await
        .map_err(db)?
        .get(0);
    let found = Stamp::parse(comment.as_deref());
    let wanted = Stamp::merged(found.as_ref(), tags, true);
    if found.as_ref() != Some(&wanted) {
        tx.batch_execute(&stamp_statement(&format!("{schema}.fence_marks"), &wanted))
            .await
            .map_err(db)?;
    }
    Ok(())
}
