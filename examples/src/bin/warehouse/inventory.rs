//! The inventory service. It trusts the `Fencing-Token` and `Fencing-Resource` headers only
//! because fence-gateway sits in front of it and is the only way in; it records the token's
//! revision with every write so the audit can check the order writes were applied in.
//!
//! What every storage behind the gateway should do (docs/DESIGN.md §4 "Resource binding"): write
//! only the resource the gateway verified the token for. The gateway sends exactly one
//! `Fencing-Resource` and one `Fencing-Token` with every write it admits; a write whose path names
//! another aisle, or that comes with no or several of either header, is refused here with 403 —
//! defence in depth, and the only binding of path to resource when the gateway runs in header mode.
//!
//! With `--fence-in-db` (PostgreSQL only) the inventory does not trust the token either: the
//! in-database fencing package (docs/POSTGRES.md) protects the `applied` table, its resource the
//! row's `aisle`, and every write presents the `Fencing-Token` in its own transaction (`SET LOCAL
//! fencing.token`). So writers that go straight to the database — the Python psycopg robot,
//! `examples/python/pg_robot.py` — and the robots that go through the inventory are fenced by the
//! same marks, in the same table; a stale token is refused by the database (409 here). Writes
//! run side by side on a pool of connections, each within `--db-timeout` (the server's
//! `statement_timeout` and `lock_timeout` end its waiting too): a write held up on one aisle
//! (an open transaction of its old holder) holds up no other, and answers 503 when it is late.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, RecyclingMethod};

use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};

use crate::Failure;

/// `warehouse inventory` options.
#[derive(clap::Args)]
pub(crate) struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: String,
    /// `sqlite:PATH` (default) or a `postgres://` URL.
    #[arg(long, default_value = "sqlite:warehouse.db")]
    db: String,
    /// Fence in the database (`--db postgres://…` with the in-database package installed and
    /// its keys synced): protect the `applied` table at start and present each write's
    /// `Fencing-Token` in the write's transaction. The role of `--db` must own the table.
    #[arg(long)]
    fence_in_db: bool,
    /// The in-database package's schema, for `--fence-in-db`.
    #[arg(long, default_value = "fencing", requires = "fence_in_db")]
    fencing_schema: String,
    /// How long a `--fence-in-db` write may take, its wait for a connection included (then
    /// 503); the database ends the transaction's own waiting at the same deadline.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration, requires = "fence_in_db")]
    db_timeout: Duration,
    /// Serve HTTPS with this certificate (PEM), with `--tls-key`.
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<std::path::PathBuf>,
    /// The private key (PEM) of `--tls-cert`.
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<std::path::PathBuf>,
}

/// One applied write, as the audit reads it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Applied {
    pub(crate) seq: i64,
    pub(crate) aisle: String,
    pub(crate) robot: String,
    pub(crate) revision: i64,
    pub(crate) count: i64,
}

/// A write to record, with the token it came with.
struct Write<'a> {
    aisle: &'a str,
    robot: &'a str,
    /// The token's revision.
    revision: i64,
    count: i64,
    token: &'a str,
}

/// The statement every database mode records a write with (`$n` placeholders; SQLite reads
/// them as positional parameters too).
const INSERT: &str = "INSERT INTO applied (aisle, robot, revision, count) VALUES ($1, $2, $3, $4)";

/// A count sent by a robot.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Count {
    pub(crate) robot: String,
    pub(crate) count: i64,
}

enum Db {
    Sqlite(Mutex<rusqlite::Connection>),
    Postgres(tokio_postgres::Client),
    /// `--fence-in-db`: a transaction per write, on a pool.
    Fenced(Fenced),
}

/// Most connections the `--fence-in-db` inventory keeps to the database.
const POOL_SIZE: usize = 8;

/// The `--fence-in-db` database: a pool, and every write's deadline.
struct Fenced {
    pool: Pool,
    deadline: Duration,
}

/// Why a write was not recorded.
enum Refusal {
    /// The database's fencing refused the token: its SQLSTATE (`23F01`, `28F0x`) and message.
    Fenced(String, String),
    /// Not written, or not known to be: the database was unreachable, or the write was late.
    Unavailable(String),
    Failed(Failure),
}

impl<E: Into<Failure>> From<E> for Refusal {
    fn from(e: E) -> Self {
        let e: Failure = e.into();
        let Some(pg) = e.downcast_ref::<tokio_postgres::Error>() else {
            return Refusal::Failed(e);
        };
        let Some(db) = pg.as_db_error() else {
            // The connection's: closed, refused, broken mid-call.
            return Refusal::Unavailable(format!("PostgreSQL: {pg}"));
        };
        let code = db.code().code();
        let starts = |classes: &[&str]| classes.iter().any(|c| code.starts_with(c));
        if starts(&["23F", "28F"]) {
            Refusal::Fenced(code.to_owned(), db.message().to_owned())
        } else if starts(&["40", "57", "08", "53", "55P03"]) {
            // Retry: a transaction rollback (40F01 a gateway's write in flight, serialization,
            // deadlock), a timeout or shutdown, a connection or resource problem, a lock wait.
            Refusal::Unavailable(format!("PostgreSQL: {} ({code})", db.message()))
        } else {
            Refusal::Failed(e)
        }
    }
}

impl Db {
    async fn open(args: &Args) -> Result<Self, Failure> {
        const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS applied (
            seq INTEGER PRIMARY KEY, aisle TEXT NOT NULL, robot TEXT NOT NULL,
            revision BIGINT NOT NULL, count BIGINT NOT NULL)";
        let url = &args.db;
        if let Some(path) = url.strip_prefix("sqlite:") {
            if args.fence_in_db {
                return Err("--fence-in-db needs a postgres:// --db".into());
            }
            let conn = rusqlite::Connection::open(path)?;
            conn.execute_batch(SCHEMA)?;
            return Ok(Db::Sqlite(Mutex::new(conn)));
        }
        let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
        tokio::spawn(connection);
        client
            .batch_execute(&SCHEMA.replace("seq INTEGER PRIMARY KEY", "seq BIGSERIAL PRIMARY KEY"))
            .await?;
        if !args.fence_in_db {
            return Ok(Db::Postgres(client));
        }
        if args.db_timeout.is_zero() {
            return Err("--db-timeout must be above zero".into());
        }
        // Every row's resource is its aisle: the name the robots lease.
        let schema = &args.fencing_schema;
        if schema.is_empty() || !schema.bytes().all(|b| b.is_ascii_lowercase() || b == b'_') {
            return Err(
                format!("--fencing-schema: `{schema}` is not a lowercase identifier").into(),
            );
        }
        client
            .execute(&format!("SELECT {schema}.protect('applied', 'aisle')"), &[])
            .await?;
        let manager = Manager::from_config(
            url.parse()?,
            tokio_postgres::NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager).max_size(POOL_SIZE).build()?;
        Ok(Db::Fenced(Fenced {
            pool,
            deadline: args.db_timeout,
        }))
    }

    async fn append(&self, w: &Write<'_>) -> Result<(), Refusal> {
        match self {
            Db::Sqlite(conn) => {
                let conn = conn.lock().map_err(|_| "poisoned")?;
                conn.execute(
                    INSERT,
                    rusqlite::params![w.aisle, w.robot, w.revision, w.count],
                )?;
            }
            Db::Postgres(client) => {
                client
                    .execute(INSERT, &[&w.aisle, &w.robot, &w.revision, &w.count])
                    .await?;
            }
            Db::Fenced(db) => db.append(w).await?,
        }
        Ok(())
    }

    async fn log(&self) -> Result<Vec<Applied>, Failure> {
        const SELECT: &str = "SELECT seq, aisle, robot, revision, count FROM applied ORDER BY seq";
        match self {
            Db::Sqlite(conn) => {
                let conn = conn.lock().map_err(|_| "poisoned")?;
                let mut stmt = conn.prepare(SELECT)?;
                let rows = stmt.query_map([], |r| {
                    Ok(Applied {
                        seq: r.get(0)?,
                        aisle: r.get(1)?,
                        robot: r.get(2)?,
                        revision: r.get(3)?,
                        count: r.get(4)?,
                    })
                })?;
                Ok(rows.collect::<Result<_, _>>()?)
            }
            Db::Postgres(client) => pg_log(client).await,
            Db::Fenced(db) => {
                let client = db.pool.get().await?;
                pg_log(&client).await
            }
        }
    }
}

impl Fenced {
    /// The write in a transaction of its own that presents `token`, committed within the
    /// deadline, or refused.
    async fn append(&self, w: &Write<'_>) -> Result<(), Refusal> {
        let late = || Refusal::Unavailable("the write did not commit within --db-timeout".into());
        let started = tokio::time::Instant::now();
        let mut client = tokio::time::timeout(self.deadline, self.pool.get())
            .await
            .map_err(|_| late())?
            .map_err(|e| Refusal::Unavailable(format!("PostgreSQL: {e}")))?;
        let left = self.deadline.saturating_sub(started.elapsed());
        let done = tokio::time::timeout(left, Self::transaction(&mut client, left, w)).await;
        match done {
            Ok(Ok(())) => Ok(()),
            failed => {
                // Its session may be mid-transaction, or mid-query: never handed to the next
                // write (dropped, the connection closes and the server rolls it back).
                drop(Object::take(client));
                match failed {
                    Ok(Err(e)) => Err(Refusal::from(e)),
                    _ => Err(late()),
                }
            }
        }
    }

    async fn transaction(
        client: &mut Object,
        left: Duration,
        w: &Write<'_>,
    ) -> Result<(), tokio_postgres::Error> {
        let tx = client.transaction().await?;
        let ms = left.as_millis().max(1);
        tx.batch_execute(&format!(
            "SET LOCAL statement_timeout = {ms}; SET LOCAL lock_timeout = {ms}"
        ))
        .await?;
        // SET LOCAL fencing.token = '…': the protected table's trigger verifies it.
        tx.execute("SELECT set_config('fencing.token', $1, true)", &[&w.token])
            .await?;
        tx.execute(INSERT, &[&w.aisle, &w.robot, &w.revision, &w.count])
            .await?;
        tx.commit().await
    }
}

async fn pg_log(client: &tokio_postgres::Client) -> Result<Vec<Applied>, Failure> {
    const SELECT: &str = "SELECT seq, aisle, robot, revision, count FROM applied ORDER BY seq";
    Ok(client
        .query(SELECT, &[])
        .await?
        .iter()
        .map(|r| Applied {
            seq: r.get(0),
            aisle: r.get(1),
            robot: r.get(2),
            revision: r.get(3),
            count: r.get(4),
        })
        .collect())
}

/// Serves the inventory until killed.
pub(crate) async fn serve(args: Args) -> Result<std::process::ExitCode, Failure> {
    let db = Arc::new(Db::open(&args).await?);
    let app = Router::new()
        .route("/aisles/{aisle}/count", put(record))
        .route("/log", get(log))
        .with_state(db);
    let tcp = tokio::net::TcpListener::bind(&args.listen).await?;
    let tls = match (args.tls_cert, args.tls_key) {
        (Some(cert), Some(key)) => Some(Arc::new(runtime::tls::ServerTls::load(
            runtime::tls::ServerFiles {
                cert,
                key,
                client_ca: None,
                client_certs: runtime::tls::ClientCerts::Optional,
            },
        )?)),
        _ => None,
    };
    let draining = std::sync::atomic::AtomicBool::new(false);
    runtime::serve::until_shutdown(
        runtime::serve::Listener { tcp, tls },
        app,
        runtime::serve::terminated(),
        &draining,
        tokio_util::sync::CancellationToken::new(),
        runtime::serve::Drain {
            delay: std::time::Duration::ZERO,
            deadline: std::time::Duration::from_secs(5),
        },
        runtime::serve::Limits::default(),
    )
    .await?;
    Ok(std::process::ExitCode::SUCCESS)
}

async fn record(
    State(db): State<Arc<Db>>,
    Path(aisle): Path<String>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    // A count is JSON whatever its Content-Type says: the SDK's `Lease::forward` sends a bare
    // body.
    let Ok(count) = serde_json::from_slice::<Count>(&body) else {
        return (StatusCode::BAD_REQUEST, "the body is not a count").into_response();
    };
    // The aisle the gateway checked the token for, and the token: exactly one of each.
    let (Some(verified), Some(token)) = (
        single(&headers, fencing::RESOURCE_HEADER),
        single(&headers, fencing::TOKEN_HEADER),
    ) else {
        return refused("exactly one Fencing-Resource and one Fencing-Token are required");
    };
    if verified != aisle {
        return refused("the path names another aisle than the verified Fencing-Resource");
    }
    // `v1.{kid}.{era}.{revision}.…`, already verified by the gateway in front.
    let Some(revision) = token.split('.').nth(3).and_then(|r| r.parse::<i64>().ok()) else {
        return refused("malformed Fencing-Token");
    };
    let write = Write {
        aisle: &aisle,
        robot: &count.robot,
        revision,
        count: count.count,
        token,
    };
    match db.append(&write).await {
        Ok(()) => (StatusCode::OK, "recorded").into_response(),
        // As fence-gateway answers the same refusals.
        Err(Refusal::Fenced(code, message)) => {
            let (status, slug) = match code.as_str() {
                "23F01" => (StatusCode::CONFLICT, "stale-fencing-token"),
                "28F04" => (StatusCode::FORBIDDEN, "wrong-resource-fencing-token"),
                _ => (StatusCode::UNAUTHORIZED, "invalid-fencing-token"),
            };
            problem(status, slug, &message)
        }
        Err(Refusal::Unavailable(detail)) => problem(
            StatusCode::SERVICE_UNAVAILABLE,
            "storage-unavailable",
            &detail,
        ),
        Err(Refusal::Failed(e)) => {
            (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response()
        }
    }
}

/// The value of header `name` if it was sent exactly once, as text.
fn single<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    let mut values = headers.get_all(name).iter();
    match (values.next(), values.next()) {
        (Some(value), None) => value.to_str().ok(),
        _ => None,
    }
}

/// 403 problem+json: the write does not carry what the gateway verifies for the aisle it names.
fn refused(detail: &str) -> Response {
    problem(StatusCode::FORBIDDEN, "fencing-resource-mismatch", detail)
}

/// A problem+json answer of `status`, typed `slug`.
fn problem(status: StatusCode, slug: &str, detail: &str) -> Response {
    let body = serde_json::json!({
        "type": format!("{}{slug}", fencing::layer::PROBLEM_BASE),
        "title": status.canonical_reason().unwrap_or("Refused"),
        "status": status.as_u16(),
        "detail": detail,
    });
    (
        status,
        [(header::CONTENT_TYPE, "application/problem+json")],
        body.to_string(),
    )
        .into_response()
}

async fn log(State(db): State<Arc<Db>>) -> Result<Json<Vec<Applied>>, (StatusCode, String)> {
    db.log()
        .await
        .map(Json)
        .map_err(|e| (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))
}
