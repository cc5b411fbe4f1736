//! The pre-fence at every grant: the previous holder is cut off before the new grant is
//! returned, at an enforcer over HTTP (`--prefence-url`: `POST {url}/fence/{resource}`), in
//! PostgreSQL with fencing's in-database package (`--prefence-database-url`), or both. Either
//! failing withdraws the grant (fail closed); each is bounded by `--forward-timeout`.
//!
//! In the database the raise is `SELECT {schema}.admit(resource, token)` in a transaction of
//! its own, committed before the grant is returned: `admit` verifies the token as every writer's
//! does and raises the resource's mark, waiting for the transactions that admitted a lower token
//! (they commit before it or are refused), so once the commit returns no SQL writer of an older
//! holder can land. The transaction's `statement_timeout` and `lock_timeout` end the database's
//! waiting with ours; a connection whose call failed or timed out is discarded, never reused.

use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};

use crate::error::{Error, Result};
use crate::upstream::Upstream;

/// Most connections the pre-fence keeps to the database.
const POOL_SIZE: usize = 16;

/// Where grants are pre-fenced.
#[derive(Clone, Default)]
pub(crate) struct Prefence {
    pub(crate) http: Option<Upstream>,
    pub(crate) database: Option<Database>,
}

impl Prefence {
    /// Raises every configured mark of `resource` to `signed_token`; the first failure ends it.
    pub(crate) async fn raise(&self, resource: &str, signed_token: &str) -> Result<()> {
        if let Some(enforcer) = &self.http {
            enforcer.prefence(resource, signed_token).await?;
        }
        if let Some(db) = &self.database {
            db.raise(resource, signed_token).await?;
        }
        Ok(())
    }
}

/// PostgreSQL with the in-database package.
#[derive(Clone)]
pub(crate) struct Database {
    pool: Pool,
    /// `SELECT {schema}.admit($1, $2)`.
    admit: String,
    deadline: Duration,
}

impl Database {
    /// A pool for `url` (connections are made on first use); `schema` is the package's (both
    /// checked when the configuration is validated).
    pub(crate) fn new(url: &str, schema: &str, deadline: Duration) -> Result<Self, String> {
        let config: tokio_postgres::Config = url
            .parse()
            .map_err(|e| format!("--prefence-database-url: {e}"))?;
        let manager = Manager::from_config(
            config,
            tokio_postgres::NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(POOL_SIZE)
            .build()
            .map_err(|e| format!("--prefence-database-url: {e}"))?;
        Ok(Self {
            pool,
            admit: format!("SELECT {schema}.admit($1, $2)"),
            deadline,
        })
    }

    /// The raise, committed, within the deadline.
    async fn raise(&self, resource: &str, signed_token: &str) -> Result<()> {
        let failed = |e: &dyn std::fmt::Display| Error::PrefenceFailed(format!("PostgreSQL: {e}"));
        let work = async {
            let mut client = self.pool.get().await.map_err(|e| failed(&e))?;
            let done = async {
                let tx = client.transaction().await?;
                let ms = self.deadline.as_millis().max(1);
                tx.batch_execute(&format!(
                    "SET LOCAL statement_timeout = {ms}; SET LOCAL lock_timeout = {ms}"
                ))
                .await?;
                tx.query_one(&self.admit, &[&resource, &signed_token])
                    .await?;
                tx.commit().await
            }
            .await;
            if done.is_err() {
                // Its session may be mid-transaction: never handed to the next raise.
                let _ = deadpool_postgres::Object::take(client);
            }
            done.map_err(|e| failed(&db_error(&e)))
        };
        // A timeout drops the connection with the call: the server then ends the transaction.
        tokio::time::timeout(self.deadline, work)
            .await
            .map_err(|_| failed(&"the pre-fence did not commit within --forward-timeout"))?
    }
}

/// The database's own error (SQLSTATE and message) where there is one.
fn db_error(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} ({})", db.message(), db.code().code()),
        None => e.to_string(),
    }
}
