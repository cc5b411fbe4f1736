//! What an install finds in the database before it: a pgcrypto it may call as the owner, and
//! fence-gateway's tables made elsewhere, which it moves into the package schema — unless they
//! are another live package's.

use tokio_postgres::Transaction;

use super::{db, ident, PackageError, GATEWAY_TABLES};

/// Roles the install trusts with what the package runs as its owner: superusers, the owner
/// role, the installing role, and the database owner (`pg_database_owner`, which owns `public`
/// from PostgreSQL 15) if it is one of those. SQL text for `… IN (TRUSTED)`, `$1` the owner.
pub(super) const TRUSTED: &str = "SELECT r.oid FROM pg_catalog.pg_roles AS r \
    WHERE r.rolsuper OR r.rolname = $1 OR r.rolname = current_user \
    UNION SELECT o.oid FROM pg_catalog.pg_roles AS o, pg_catalog.pg_database AS d \
    WHERE o.rolname = 'pg_database_owner' AND d.datname = pg_catalog.current_database() \
      AND d.datdba IN (SELECT t.oid FROM pg_catalog.pg_roles AS t \
                       WHERE t.rolsuper OR t.rolname = $1 OR t.rolname = current_user)";

/// The schema of pgcrypto, created in the package schema if the database has none. An existing
/// pgcrypto is used only if it is safe to call as the owner: the extension and its schema owned
/// by a trusted role ([`TRUSTED`]) and nobody else allowed to create in that schema — else
/// whoever could replace `hmac` there would forge any token and read the keys.
pub(super) async fn pgcrypto_schema(
    tx: &Transaction<'_>,
    schema: &str,
    owner: &str,
) -> Result<String, PackageError> {
    let found = tx
        .query_opt(
            &format!(
                "SELECT n.nspname::text,
                        e.extowner IN ({TRUSTED}) AND n.nspowner IN ({TRUSTED})
                        AND NOT EXISTS (
                            SELECT 1 FROM pg_catalog.aclexplode(
                                coalesce(n.nspacl, pg_catalog.acldefault('n', n.nspowner))) AS a
                            WHERE a.privilege_type = 'CREATE' AND a.grantee NOT IN ({TRUSTED}))
                 FROM pg_catalog.pg_extension AS e
                 JOIN pg_catalog.pg_namespace AS n ON n.oid = e.extnamespace
                 WHERE e.extname = 'pgcrypto'"
            ),
            &[&owner],
        )
        .await
        .map_err(db)?;
    if let Some(row) = found {
        let (name, safe): (String, bool) = (row.get(0), row.get(1));
        if !safe {
            return Err(PackageError::Refused(format!(
                "pgcrypto is installed in schema {name}, which a role other than a superuser, \
                 the owner role {owner} or the installing role owns or may create in (it could \
                 replace hmac there): move it (ALTER EXTENSION pgcrypto SET SCHEMA …) to a \
                 schema only they control, or drop it and the install creates it in {schema}"
            )));
        }
        return Ok(ident(&name));
    }
    tx.batch_execute(&format!("CREATE EXTENSION pgcrypto SCHEMA {schema}"))
        .await
        .map_err(|e| {
            let e = db(e);
            PackageError::Refused(format!(
                "{e}: the package needs pgcrypto (contrib; Debian: postgresql-contrib)"
            ))
        })?;
    Ok(schema.to_owned())
}

/// Moves fence-gateway's tables into the package schema if a gateway made them elsewhere, so
/// that there is one set of marks; refuses if there would be two, and never moves the marks of
/// a package in another schema (installed, or uninstalled: its marks stay its).
pub(super) async fn adopt_gateway_tables(
    tx: &Transaction<'_>,
    schema: &str,
    owner: &str,
    gateway_roles: &[String],
) -> Result<Option<String>, PackageError> {
    let rows = tx
        .query(
            "SELECT n.nspname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE c.relname = 'fence_marks' AND c.relkind = 'r' AND n.nspname <> $1 \
               AND n.nspname NOT LIKE 'pg_temp%' ORDER BY 1",
            &[&schema],
        )
        .await
        .map_err(db)?;
    let others: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
    let ours: bool = tx
        .query_one(
            "SELECT to_regclass($1) IS NOT NULL",
            &[&format!("{schema}.fence_marks")],
        )
        .await
        .map_err(db)?
        .get(0);
    match (others.as_slice(), ours) {
        ([], _) => Ok(None),
        ([other], false) => {
            refuse_a_live_package(tx, other, schema).await?;
            for table in GATEWAY_TABLES {
                refuse_untrusted_table(tx, other, table, owner, gateway_roles).await?;
            }
            for table in GATEWAY_TABLES {
                let exists: bool = tx
                    .query_one(
                        "SELECT to_regclass(format('%I.%I', $1::text, $2::text)) IS NOT NULL",
                        &[other, &table],
                    )
                    .await
                    .map_err(db)?
                    .get(0);
                if exists {
                    tx.batch_execute(&format!(
                        "ALTER TABLE {}.{table} SET SCHEMA {schema};
                         ALTER TABLE {schema}.{table} OWNER TO {};",
                        ident(other),
                        ident(owner)
                    ))
                    .await
                    .map_err(db)?;
                    revoke_every_grant(tx, schema, table).await?;
                }
            }
            Ok(Some(other.clone()))
        }
        _ => Err(PackageError::Refused(format!(
            "fence_marks exists in schema(s) {others:?}{}: one resource must have one mark — \
             merge them by hand (keep each resource's highest mark) and retry",
            if ours {
                format!(" and in {schema}")
            } else {
                String::new()
            }
        ))),
    }
}

/// Refuses to adopt `schema.table` unless a trusted role ([`TRUSTED`]) or a gateway role owns
/// it and it carries nothing that would run code or grant access once it holds the marks: no
/// triggers, rules or row-security policies (a tenant's table of the same name, planted before
/// the install, would otherwise keep its trigger on the package's marks).
async fn refuse_untrusted_table(
    tx: &Transaction<'_>,
    schema: &str,
    table: &str,
    owner: &str,
    gateway_roles: &[String],
) -> Result<(), PackageError> {
    let row = tx
        .query_opt(
            &format!(
                "SELECT c.relowner::regrole::text,
                        c.relowner IN ({TRUSTED})
                        OR c.relowner::regrole::text = ANY($4::text[]),
                        NOT c.relrowsecurity
                        AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_trigger AS t
                                        WHERE t.tgrelid = c.oid AND NOT t.tgisinternal)
                        AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_rewrite AS w
                                        WHERE w.ev_class = c.oid)
                        AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_policy AS p
                                        WHERE p.polrelid = c.oid)
                 FROM pg_catalog.pg_class AS c
                 JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
                 WHERE n.nspname = $2 AND c.relname = $3"
            ),
            &[&owner, &schema, &table, &gateway_roles],
        )
        .await
        .map_err(db)?;
    let Some(row) = row else {
        return Ok(());
    };
    let (table_owner, trusted, plain): (String, bool, bool) = (row.get(0), row.get(1), row.get(2));
    if !trusted {
        return Err(PackageError::Refused(format!(
            "{schema}.{table} is owned by {table_owner}, neither a gateway role (--gateway-role) \
             nor the owner, the installing role or a superuser: not adopted as the marks"
        )));
    }
    if !plain {
        return Err(PackageError::Refused(format!(
            "{schema}.{table} has triggers, rules or row-security policies: not adopted as the \
             marks; remove them, or merge the marks by hand"
        )));
    }
    Ok(())
}

/// Revokes every privilege on an adopted table from every role but its (new) owner: the
/// package grants what each role needs afterwards.
async fn revoke_every_grant(
    tx: &Transaction<'_>,
    schema: &str,
    table: &str,
) -> Result<(), PackageError> {
    let grantees = tx
        .query(
            "SELECT DISTINCT CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE a.grantee::regrole::text END
             FROM pg_catalog.pg_class AS c
             JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace,
                  pg_catalog.aclexplode(c.relacl) AS a
             WHERE n.nspname = $1 AND c.relname = $2 AND a.grantee <> c.relowner",
            &[&schema, &table],
        )
        .await
        .map_err(db)?;
    for grantee in grantees {
        let grantee: String = grantee.get(0);
        tx.batch_execute(&format!("REVOKE ALL ON {schema}.{table} FROM {grantee}"))
            .await
            .map_err(db)?;
    }
    Ok(())
}

/// Refuses to adopt the tables in `other` if they are a package's marks: beside its version
/// table, or stamped as the package's (which `pg uninstall` leaves). Moving them would take the
/// marks from under that package's functions (42P01 at its next admit) — and a second package
/// in the database is a second deployment, which needs marks of its own.
async fn refuse_a_live_package(
    tx: &Transaction<'_>,
    other: &str,
    schema: &str,
) -> Result<(), PackageError> {
    let row = tx
        .query_one(
            "SELECT pg_catalog.to_regclass(format('%I.package_version', $1::text)) IS NOT NULL,
                    pg_catalog.obj_description(
                        pg_catalog.to_regclass(format('%I.fence_marks', $1::text)), 'pg_class')",
            &[&other],
        )
        .await
        .map_err(db)?;
    let (installed, comment): (bool, Option<String>) = (row.get(0), row.get(1));
    let stamped = crate::store::Stamp::parse(comment.as_deref()).is_some_and(|s| s.package);
    if installed || stamped {
        return Err(PackageError::Refused(format!(
            "schema {other} holds the fencing package's marks{}: install there (--schema \
             {other}), or give this package marks of its own by merging or dropping {other}'s \
             by hand — {schema} would take them from under it",
            if installed { "" } else { " (uninstalled)" }
        )));
    }
    Ok(())
}
