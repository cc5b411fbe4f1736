//! Fencing inside PostgreSQL (docs/POSTGRES.md): a SQL package — stock PostgreSQL ≥ 13 and
//! pgcrypto, no compiled extension — that verifies signed tokens in the writer's own
//! transaction (`admit(resource, token)`, or a trigger on protected tables), keeps the marks in
//! the very tables of fence-gateway's PostgreSQL store, and orders writers with the mark row's
//! lock. This module installs, upgrades and removes it, and loads the verification keys;
//! [`PgCommand`] is `fence-gateway pg …`.
//!
//! # The install
//!
//! One transaction under the package's lock (`session`: taken within `--lock-timeout`, its
//! holder named if it is not), so concurrent installs take turns and a failed one leaves
//! nothing behind:
//!
//! 1. the package schema, owned by the owner role (`--owner`, default the installing role);
//!    pgcrypto, into that schema unless the database already has it elsewhere;
//! 2. fence-gateway's tables, if a gateway created them in another schema (e.g. `public`), are
//!    moved into the package schema, data and all — one set of marks, never two — unless they
//!    are another package's (`adopt`); the marks are stamped as the package's
//!    (`store::postgres::marks`);
//! 3. as the owner role: the version table, each migration above the installed version
//!    (`sql/v1.sql`, …), the functions (`sql/functions.sql`, replaced on every install) and the
//!    privileges (`sql/grants.sql`), then the grants to `--writer` and `--gateway-role` roles; a
//!    gateway role's `search_path` is set to the package schema in this database, so the store's
//!    unqualified table names resolve there;
//! 4. as a superuser only: the event trigger that protects a table created or attached under a
//!    protected one (`sql/protect.sql`).
//!
//! A database whose package is newer than this binary's is refused, never downgraded.

mod adopt;
mod command;
mod remove;
mod session;

pub use command::{run, GatewayCommand, PgCommand, Target};
pub use remove::{sync_keys, uninstall, Uninstalled};

use std::time::Duration;

use tokio_postgres::Transaction;

use session::{begin, connect, in_slices};

/// The package version this binary installs.
pub const PACKAGE_VERSION: i32 = 3;

/// Each version's migration, applied once, in order, as the owner role.
const MIGRATIONS: &[(i32, &str)] = &[
    (1, include_str!("sql/v1.sql")),
    (2, include_str!("sql/v2.sql")),
    (3, include_str!("sql/v3.sql")),
];
/// Replaced on every install.
const FUNCTIONS: &str = include_str!("sql/functions.sql");
const PROTECT: &str = include_str!("sql/protect.sql");
/// Made by a superuser's install only.
const EVENT_TRIGGER: &str = include_str!("sql/event_trigger.sql");
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
    /// A lock the command needs was held by other sessions (named) until its deadline.
    #[error("{0}")]
    Busy(String),
    /// The database is not in a state this command can work on.
    #[error("{0}")]
    Refused(String),
}

fn db(e: tokio_postgres::Error) -> PackageError {
    // The Display form of a server error says only "db error"; the source has the message.
    if e.code() == Some(&tokio_postgres::error::SqlState::LOCK_NOT_AVAILABLE) {
        return PackageError::Busy(
            e.as_db_error()
                .map_or_else(|| e.to_string(), |d| d.message().to_owned()),
        );
    }
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
    /// How long the install may wait for the package's lock and for each lock after it.
    pub lock_timeout: Duration,
}

/// How long a `pg` command waits for a lock unless told (`--lock-timeout`).
pub const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_secs(30);

impl Default for InstallOptions {
    fn default() -> Self {
        Self {
            schema: "fencing".to_owned(),
            owner: None,
            writers: Vec::new(),
            gateway_roles: Vec::new(),
            lock_timeout: DEFAULT_LOCK_TIMEOUT,
        }
    }
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
    /// Whether the event trigger that protects tables added under protected ones is there
    /// (only a superuser's install makes it).
    pub event_trigger: bool,
    /// Protected tables whose owner should run `protect` again: their triggers are an older
    /// version's, or a table added under them since lacks them.
    pub protect_again: Vec<String>,
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

/// The installed version, 0 if none.
pub(super) async fn installed_version(
    tx: &Transaction<'_>,
    schema: &str,
) -> Result<i32, PackageError> {
    let table = format!("{schema}.package_version");
    let exists: bool = tx
        .query_one("SELECT pg_catalog.to_regclass($1) IS NOT NULL", &[&table])
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
    let deadline = begin(&tx, schema, options.lock_timeout).await?;
    let me: String = tx
        .query_one("SELECT current_user::text", &[])
        .await
        .map_err(db)?
        .get(0);
    let owner = options.owner.clone().unwrap_or_else(|| me.clone());
    check_roles(&tx, &me, &owner, options).await?;
    let done = in_slices(&tx, deadline, schema, || {
        install_in(&tx, options, &me, &owner)
    })
    .await?;
    tx.commit().await.map_err(db)?;
    Ok(done)
}

/// The owner must be neither a writer nor a gateway role, nor one they can act as: a role that
/// is a member of the owner (directly, through other roles, or by `SET ROLE`; superusers are
/// members of every role) could write the marks and read the keys. And the installing role must
/// be able to act as the owner.
async fn check_roles(
    tx: &Transaction<'_>,
    me: &str,
    owner: &str,
    options: &InstallOptions,
) -> Result<(), PackageError> {
    for role in options.writers.iter().chain(&options.gateway_roles) {
        let member: bool = tx
            .query_one(
                "SELECT pg_catalog.pg_has_role($1::text::regrole, $2::text::regrole, 'MEMBER')",
                &[role, &owner],
            )
            .await
            .map_err(db)?
            .get(0);
        if role == owner || member {
            return Err(PackageError::Usage(format!(
                "the owner role {owner:?} must not be a writer or gateway role, nor can {role:?} \
                 be a member of it (or a superuser): the owner reads the keys and writes the \
                 marks, and a member can act as it (SET ROLE)"
            )));
        }
    }
    let member: bool = tx
        .query_one(
            "SELECT pg_catalog.pg_has_role(current_user, $1::text::regrole, 'MEMBER')",
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
    Ok(())
}

/// Makes `schema`, owned by `owner`, unless it is there already; refuses one someone else owns.
async fn owned_schema(tx: &Transaction<'_>, schema: &str, owner: &str) -> Result<(), PackageError> {
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
                ident(owner)
            ))
            .await
            .map_err(db)?,
        Some(o) if o == owner || o == ident(owner) => {}
        Some(o) => {
            return Err(PackageError::Refused(format!(
                "schema {schema} is owned by {o}, not by the owner role {owner}"
            )))
        }
    }
    Ok(())
}

/// The install's work after its lock (one attempt of it: see `in_slices`).
async fn install_in(
    tx: &Transaction<'_>,
    options: &InstallOptions,
    me: &str,
    owner: &str,
) -> Result<Installed, PackageError> {
    let schema = options.schema.as_str();
    owned_schema(tx, schema, owner).await?;
    let crypto = adopt::pgcrypto_schema(tx, schema, owner).await?;
    let from = installed_version(tx, schema).await?;
    if from > PACKAGE_VERSION {
        return Err(PackageError::Refused(format!(
            "schema {schema} holds package version {from}, newer than this binary's {PACKAGE_VERSION}: use a newer fence-gateway"
        )));
    }
    let adopted_from =
        adopt::adopt_gateway_tables(tx, schema, owner, &options.gateway_roles).await?;
    if owner != me {
        tx.batch_execute(&format!("SET LOCAL ROLE {}", ident(owner)))
            .await
            .map_err(db)?;
    }
    create_as_owner(tx, options, from, &crypto).await?;
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
    let event_trigger = event_trigger(tx, schema).await?;
    let protect_again = protect_again(tx, schema).await?;
    Ok(Installed {
        from,
        to: PACKAGE_VERSION,
        adopted_from,
        event_trigger,
        protect_again,
    })
}

/// Protected tables whose triggers an older version made, or under which a table lacks them:
/// their owners should run `protect` again (an install cannot: it does not own them).
async fn protect_again(tx: &Transaction<'_>, schema: &str) -> Result<Vec<String>, PackageError> {
    let tables = tx
        .query(
            &format!(
                "SELECT g.tgrelid::regclass::text FROM pg_catalog.pg_trigger AS g
                 JOIN pg_catalog.pg_class AS c ON c.oid = g.tgrelid
                 JOIN pg_catalog.pg_proc AS p ON p.oid = g.tgfoid
                 JOIN pg_catalog.pg_namespace AS n ON n.oid = p.pronamespace
                 WHERE g.tgname = 'fence_guard' AND g.tgparentid = 0 AND p.proname = 'row_guard'
                   AND n.nspname = $1
                   AND (g.tgnargs < 4 OR {schema}._unguarded_under(g.tgrelid) IS NOT NULL
                        OR NOT EXISTS (SELECT FROM pg_catalog.pg_trigger AS t
                                       WHERE t.tgrelid = g.tgrelid AND t.tgname = 'fence_guard_truncate')
                        OR (c.relkind = 'r' AND NOT c.relispartition
                            AND NOT EXISTS (SELECT FROM pg_catalog.pg_trigger AS t
                                            WHERE t.tgrelid = g.tgrelid AND t.tgname = 'fence_guard_tree')))
                 ORDER BY 1"
            ),
            &[&schema],
        )
        .await
        .map_err(db)?
        .iter()
        .map(|r| r.get(0))
        .collect();
    Ok(tables)
}

/// As the owner role: the version table, the migrations above `from`, the functions, the
/// privileges and the grants to writers and gateways, and the marks' stamp.
async fn create_as_owner(
    tx: &Transaction<'_>,
    options: &InstallOptions,
    from: i32,
    crypto: &str,
) -> Result<(), PackageError> {
    let schema = options.schema.as_str();
    tx.batch_execute(&format!(
        "CREATE TABLE IF NOT EXISTS {schema}.package_version (
            version int PRIMARY KEY,
            installed_at timestamptz NOT NULL DEFAULT now(),
            installed_by text NOT NULL DEFAULT session_user)"
    ))
    .await
    .map_err(db)?;
    for (version, sql) in MIGRATIONS.iter().filter(|(v, _)| *v > from) {
        tx.batch_execute(&render(sql, schema, crypto))
            .await
            .map_err(db)?;
        tx.execute(
            &format!("INSERT INTO {schema}.package_version (version) VALUES ($1)"),
            &[version],
        )
        .await
        .map_err(db)?;
    }
    for sql in [FUNCTIONS, PROTECT, GRANTS] {
        tx.batch_execute(&render(sql, schema, crypto))
            .await
            .map_err(db)?;
    }
    for writer in &options.writers {
        let w = ident(writer);
        tx.batch_execute(&format!(
            "GRANT USAGE ON SCHEMA {schema} TO {w};
             GRANT EXECUTE ON FUNCTION {schema}.admit(text, text), {schema}.admit_presented(text),
                 {schema}.mark(text), {schema}.protect(regclass, text), {schema}.unprotect(regclass),
                 {schema}._resource_of(text, record), {schema}._resources_of(text, record, record),
                 {schema}._unguarded_under(regclass),
                 {schema}._tree(regclass), {schema}._unguard(regclass),
                 {schema}._guard(regclass, text, text, text, boolean), {schema}._enable(regclass)
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
    remove::stamp(tx, schema, &[]).await
}

/// The event trigger that protects tables added under protected ones (sql/event_trigger.sql),
/// made or renewed if the installing role is a superuser; whether the database has it.
async fn event_trigger(tx: &Transaction<'_>, schema: &str) -> Result<bool, PackageError> {
    let row = tx
        .query_one(
            "SELECT r.rolsuper, EXISTS (SELECT FROM pg_catalog.pg_event_trigger AS e
                 WHERE e.evtfoid = pg_catalog.to_regprocedure($1))
             FROM pg_catalog.pg_roles AS r WHERE r.rolname = current_user",
            &[&format!("{schema}._protect_added()")],
        )
        .await
        .map_err(db)?;
    let (superuser, exists): (bool, bool) = (row.get(0), row.get(1));
    if !superuser {
        return Ok(exists);
    }
    tx.batch_execute(&render(EVENT_TRIGGER, schema, ""))
        .await
        .map_err(db)?;
    if !exists {
        // A name of at most 63 bytes (an identifier), the schema's first.
        let name: String = format!("{schema}_protect_added").chars().take(63).collect();
        tx.batch_execute(&format!(
            "CREATE EVENT TRIGGER {name} ON ddl_command_end
                 WHEN TAG IN ('CREATE TABLE', 'ALTER TABLE', 'CREATE FOREIGN TABLE')
                 EXECUTE FUNCTION {schema}._protect_added();
             ALTER EVENT TRIGGER {name} ENABLE ALWAYS;"
        ))
        .await
        .map_err(db)?;
    }
    Ok(true)
}
