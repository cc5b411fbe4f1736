//! Fencing inside PostgreSQL (docs/POSTGRES.md): a SQL package — stock PostgreSQL ≥ 13 and
//! pgcrypto, no compiled extension — that verifies signed tokens in the writer's own
//! transaction (`admit(resource, token)`, or a trigger on protected tables), keeps the marks in
//! the very tables of fence-gateway's PostgreSQL store, and orders writers with the mark row's
//! lock. This module installs, upgrades and removes it, and loads the verification keys;
//! [`PgCommand`] is `fence-gateway pg …`.
//!
//! # The install
//!
//! One transaction under an advisory lock, so concurrent installs take turns and a failed one
//! leaves nothing behind:
//!
//! 1. the package schema, owned by the owner role (`--owner`, default the installing role);
//!    pgcrypto, into that schema unless the database already has it elsewhere;
//! 2. fence-gateway's tables, if a gateway created them in another schema (e.g. `public`), are
//!    moved into the package schema, data and all — one set of marks, never two;
//! 3. as the owner role: the version table, each migration above the installed version
//!    (`sql/v1.sql`, …), the functions (`sql/functions.sql`, replaced on every install) and the
//!    privileges (`sql/grants.sql`), then the grants to `--writer` and `--gateway-role` roles; a
//!    gateway role's `search_path` is set to the package schema in this database, so the store's
//!    unqualified table names resolve there.
//!
//! A database whose package is newer than this binary's is refused, never downgraded.

mod command;

pub use command::{run, GatewayCommand, PgCommand, Target};

use tokio_postgres::{Client, NoTls, Transaction};

use crate::Keyring;

/// The package version this binary installs.
pub const PACKAGE_VERSION: i32 = 1;

/// Each version's migration, applied once, in order, as the owner role.
const MIGRATIONS: &[(i32, &str)] = &[(1, include_str!("sql/v1.sql"))];
/// Replaced on every install.
const FUNCTIONS: &str = include_str!("sql/functions.sql");
const GRANTS: &str = include_str!("sql/grants.sql");

/// The tables fence-gateway's PostgreSQL store creates (fencing/src/store/postgres/mod.rs).
const GATEWAY_TABLES: [&str; 3] = ["fence_marks", "fence_inflight", "fence_probe"];

/// Why a `pg` command did not do its work. Nothing was changed in the database.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PackageError {
    /// The arguments cannot be used (a schema or role name, the owner among the writers).
    #[error("{0}")]
    Usage(String),
    /// The key file does not load; the database was not contacted.
    #[error(transparent)]
    Keys(#[from] crate::Error),
    /// The database refused or failed.
    #[error("PostgreSQL: {0}")]
    Database(String),
    /// The database is not in a state this command can work on.
    #[error("{0}")]
    Refused(String),
}

fn db(e: tokio_postgres::Error) -> PackageError {
    // The Display form of a server error says only "db error"; the source has the message.
    match e.as_db_error() {
        Some(d) => PackageError::Database(match d.hint() {
            Some(hint) => format!("{} ({}) hint: {hint}", d.message(), d.code().code()),
            None => format!("{} ({})", d.message(), d.code().code()),
        }),
        None => PackageError::Database(e.to_string()),
    }
}

/// What `pg install` is told.
#[derive(Debug, Clone)]
pub struct InstallOptions {
    /// The package schema: `[a-z_][a-z0-9_]*`, at most 63 bytes.
    pub schema: String,
    /// The role owning the package (marks, keys, functions); the installing role by default,
    /// which must be a member of it.
    pub owner: Option<String>,
    /// Roles that may call `admit`, `admit_presented`, `mark`, `protect`, `unprotect` — and so
    /// write to protected tables. Never the owner.
    pub writers: Vec<String>,
    /// Roles fence-gateway connects as: the store's tables directly, its `search_path` set to
    /// the package schema.
    pub gateway_roles: Vec<String>,
}

/// What an install did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Installed {
    /// The version installed before, 0 for none.
    pub from: i32,
    /// The version installed now.
    pub to: i32,
    /// Where fence-gateway's tables were moved from, if they were.
    pub adopted_from: Option<String>,
}

/// Quotes an identifier (a role name) for SQL text.
fn ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

fn check_schema(schema: &str) -> Result<(), PackageError> {
    let ok = !schema.is_empty()
        && schema.len() <= 63
        && schema.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
        && schema
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        && !schema.starts_with("pg_")
        && schema != "public";
    if ok {
        Ok(())
    } else {
        Err(PackageError::Usage(format!(
            "--schema {schema:?}: use a new schema of its own, [a-z_][a-z0-9_]* (not public, not pg_*)"
        )))
    }
}

fn render(sql: &str, schema: &str, crypto: &str) -> String {
    sql.replace("@schema@", schema).replace("@crypto@", crypto)
}

async fn connect(url: &str) -> Result<Client, PackageError> {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await.map_err(db)?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "pg command: connection ended");
        }
    });
    Ok(client)
}

/// Starts a command's transaction: its `search_path` fixed to `pg_catalog, pg_temp` (so that
/// nothing a tenant planted in a schema of the installing role's path — `public`, `"$user"` —
/// is ever resolved by the command's own statements, run as that role), then serialised with
/// every other install, upgrade, removal and key load of the database.
async fn lock(tx: &Transaction<'_>) -> Result<(), PackageError> {
    tx.batch_execute(
        "SET LOCAL search_path = pg_catalog, pg_temp;
         SELECT pg_catalog.pg_advisory_xact_lock(
             pg_catalog.hashtextextended('lease-proxy/fencing/package', 0::int8))",
    )
    .await
    .map_err(db)?;
    Ok(())
}

/// The installed version, 0 if none.
async fn installed_version(tx: &Transaction<'_>, schema: &str) -> Result<i32, PackageError> {
    let table = format!("{schema}.package_version");
    let exists: bool = tx
        .query_one("SELECT to_regclass($1) IS NOT NULL", &[&table])
        .await
        .map_err(db)?
        .get(0);
    if !exists {
        return Ok(0);
    }
    let row = tx
        .query_one(
            &format!("SELECT coalesce(max(version), 0) FROM {table}"),
            &[],
        )
        .await
        .map_err(db)?;
    Ok(row.get(0))
}

/// Installs or upgrades the package (see the module docs). Idempotent.
pub async fn install(url: &str, options: &InstallOptions) -> Result<Installed, PackageError> {
    let schema = options.schema.as_str();
    check_schema(schema)?;
    let mut client = connect(url).await?;
    let tx = client.transaction().await.map_err(db)?;
    lock(&tx).await?;
    let me: String = tx
        .query_one("SELECT current_user::text", &[])
        .await
        .map_err(db)?
        .get(0);
    let owner = options.owner.clone().unwrap_or_else(|| me.clone());
    if options.writers.contains(&owner) || options.gateway_roles.contains(&owner) {
        return Err(PackageError::Usage(format!(
            "the owner role {owner:?} must not be a writer or gateway role: it reads the keys and writes the marks"
        )));
    }
    let member: bool = tx
        .query_one(
            "SELECT pg_has_role(current_user, $1::text::regrole, 'MEMBER')",
            &[&owner],
        )
        .await
        .map_err(db)?
        .get(0);
    if !member {
        return Err(PackageError::Refused(format!(
            "{me} is not a member of the owner role {owner}: GRANT {owner} TO {me} first"
        )));
    }
    let schema_owner: Option<String> = tx
        .query_opt(
            "SELECT nspowner::regrole::text FROM pg_namespace WHERE nspname = $1",
            &[&schema],
        )
        .await
        .map_err(db)?
        .map(|r| r.get(0));
    match schema_owner {
        None => tx
            .batch_execute(&format!(
                "CREATE SCHEMA {schema} AUTHORIZATION {}",
                ident(&owner)
            ))
            .await
            .map_err(db)?,
        Some(o) if o == owner || o == ident(&owner) => {}
        Some(o) => {
            return Err(PackageError::Refused(format!(
                "schema {schema} is owned by {o}, not by the owner role {owner}"
            )))
        }
    }
    let crypto = pgcrypto_schema(&tx, schema, &owner).await?;
    let from = installed_version(&tx, schema).await?;
    if from > PACKAGE_VERSION {
        return Err(PackageError::Refused(format!(
            "schema {schema} holds package version {from}, newer than this binary's {PACKAGE_VERSION}: use a newer fence-gateway"
        )));
    }
    let adopted_from = adopt_gateway_tables(&tx, schema, &owner, &options.gateway_roles).await?;
    if owner != me {
        tx.batch_execute(&format!("SET LOCAL ROLE {}", ident(&owner)))
            .await
            .map_err(db)?;
    }
    tx.batch_execute(&format!(
        "CREATE TABLE IF NOT EXISTS {schema}.package_version (
            version int PRIMARY KEY,
            installed_at timestamptz NOT NULL DEFAULT now(),
            installed_by text NOT NULL DEFAULT session_user)"
    ))
    .await
    .map_err(db)?;
    for (version, sql) in MIGRATIONS.iter().filter(|(v, _)| *v > from) {
        tx.batch_execute(&render(sql, schema, &crypto))
            .await
            .map_err(db)?;
        tx.execute(
            &format!("INSERT INTO {schema}.package_version (version) VALUES ($1)"),
            &[version],
        )
        .await
        .map_err(db)?;
    }
    tx.batch_execute(&render(FUNCTIONS, schema, &crypto))
        .await
        .map_err(db)?;
    tx.batch_execute(&render(GRANTS, schema, &crypto))
        .await
        .map_err(db)?;
    for writer in &options.writers {
        let w = ident(writer);
        tx.batch_execute(&format!(
            "GRANT USAGE ON SCHEMA {schema} TO {w};
             GRANT EXECUTE ON FUNCTION {schema}.admit(text, text), {schema}.admit_presented(text),
                 {schema}.mark(text), {schema}.protect(regclass, text), {schema}.unprotect(regclass)
             TO {w};"
        ))
        .await
        .map_err(db)?;
    }
    for gateway in &options.gateway_roles {
        let g = ident(gateway);
        tx.batch_execute(&format!(
            "GRANT USAGE ON SCHEMA {schema} TO {g};
             GRANT SELECT, INSERT, UPDATE ON {schema}.fence_marks, {schema}.fence_probe TO {g};
             GRANT SELECT, INSERT, UPDATE, DELETE ON {schema}.fence_inflight TO {g};"
        ))
        .await
        .map_err(db)?;
    }
    if owner != me {
        tx.batch_execute("RESET ROLE").await.map_err(db)?;
    }
    for gateway in &options.gateway_roles {
        // The store names its tables without a schema (fencing/src/store/postgres/mod.rs).
        let database: String = tx
            .query_one("SELECT current_database()::text", &[])
            .await
            .map_err(db)?
            .get(0);
        tx.batch_execute(&format!(
            "ALTER ROLE {} IN DATABASE {} SET search_path = {schema}",
            ident(gateway),
            ident(&database)
        ))
        .await
        .map_err(db)?;
    }
    tx.commit().await.map_err(db)?;
    Ok(Installed {
        from,
        to: PACKAGE_VERSION,
        adopted_from,
    })
}

/// Roles the install trusts with what the package runs as its owner: superusers, the owner
/// role, the installing role, and the database owner (`pg_database_owner`, which owns `public`
/// from PostgreSQL 15) if it is one of those. SQL text for `… IN (TRUSTED)`, `$1` the owner.
const TRUSTED: &str = "SELECT r.oid FROM pg_catalog.pg_roles AS r \
    WHERE r.rolsuper OR r.rolname = $1 OR r.rolname = current_user \
    UNION SELECT o.oid FROM pg_catalog.pg_roles AS o, pg_catalog.pg_database AS d \
    WHERE o.rolname = 'pg_database_owner' AND d.datname = pg_catalog.current_database() \
      AND d.datdba IN (SELECT t.oid FROM pg_catalog.pg_roles AS t \
                       WHERE t.rolsuper OR t.rolname = $1 OR t.rolname = current_user)";

/// The schema of pgcrypto, created in the package schema if the database has none. An existing
/// pgcrypto is used only if it is safe to call as the owner: the extension and its schema owned
/// by a trusted role ([`TRUSTED`]) and nobody else allowed to create in that schema — else
/// whoever could replace `hmac` there would forge any token and read the keys.
async fn pgcrypto_schema(
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
/// that there is one set of marks; refuses if there would be two.
async fn adopt_gateway_tables(
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

/// What an uninstall removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Uninstalled {
    /// The tables that were protected (their triggers are gone with the package).
    pub unprotected: Vec<String>,
}

/// Removes the package's functions (and with them the triggers of protected tables, which
/// needs `force` if there are any), its keys, settings and version table. The marks and
/// registrations stay: fence-gateways may share them, and a mark must never go down.
pub async fn uninstall(url: &str, schema: &str, force: bool) -> Result<Uninstalled, PackageError> {
    check_schema(schema)?;
    let mut client = connect(url).await?;
    let tx = client.transaction().await.map_err(db)?;
    lock(&tx).await?;
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
        tx.batch_execute(&format!("DROP FUNCTION {function} CASCADE"))
            .await
            .map_err(db)?;
    }
    tx.batch_execute(&format!(
        "DROP TABLE {schema}.keys, {schema}.settings, {schema}.package_version"
    ))
    .await
    .map_err(db)?;
    tx.commit().await.map_err(db)?;
    Ok(Uninstalled { unprotected })
}

/// Replaces the package's verification keys with the key file's, whole, in one transaction:
/// a key id no longer in the file stops verifying at its commit. The file is parsed exactly as
/// the proxy and the gateway parse it, before the database is contacted, so a malformed file
/// changes nothing. Returns the key ids now in force, the signing key first.
pub async fn sync_keys(
    url: &str,
    schema: &str,
    key_file: &std::path::Path,
) -> Result<Vec<String>, PackageError> {
    check_schema(schema)?;
    let ring = Keyring::load(key_file)?;
    let (kids, secrets): (Vec<String>, Vec<Vec<u8>>) = ring
        .secrets()
        .map(|(id, secret)| (id.as_str().to_owned(), secret.to_vec()))
        .unzip();
    let mut client = connect(url).await?;
    let tx = client.transaction().await.map_err(db)?;
    lock(&tx).await?;
    if installed_version(&tx, schema).await? == 0 {
        return Err(PackageError::Refused(format!(
            "no fencing package in schema {schema}: run `fence-gateway pg install` first"
        )));
    }
    tx.execute(
        &format!("SELECT {schema}.replace_keys($1, $2)"),
        &[&kids, &secrets],
    )
    .await
    .map_err(db)?;
    tx.commit().await.map_err(db)?;
    Ok(kids)
}
