//! The PostgreSQL transactional mode, end to end: a robot takes a lease on an aisle through
//! lease-proxy, and every inventory update commits in one transaction with the fence check. A
//! second robot then takes the aisle over, and the first robot's late update is refused by the
//! database itself.
//!
//! ```sh
//! ./scripts/run.sh &    # etcd + lease-proxy on 127.0.0.1:7070 (dev key in the demo's data dir)
//! cargo run -p lease-proxy-examples --bin fenced-inventory -- \
//!     --key-file <the proxy's key file> \
//!     --database-url postgres://lease_proxy:lease_proxy@127.0.0.1:5432/lease_proxy_test
//! ```

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use fencing::store::FencedError;
use fencing::{Keyring, PostgresStore, Token};
use lease_proxy_client::{AcquireOptions, Client, Lease};

#[derive(Parser)]
struct Args {
    /// lease-proxy's base URL.
    #[arg(long, default_value = "http://127.0.0.1:7070")]
    proxy: String,
    /// The key file lease-proxy signs with (to verify tokens, as the storage side must).
    #[arg(long)]
    key_file: PathBuf,
    /// PostgreSQL holding the inventory and the fence marks.
    #[arg(long)]
    database_url: String,
    /// The aisle to count.
    #[arg(long, default_value = "aisle-7")]
    aisle: String,
}

type Failure = Box<dyn std::error::Error>;

#[tokio::main]
async fn main() -> Result<(), Failure> {
    let args = Args::parse();
    let keys = Keyring::load(&args.key_file)?;
    let store = PostgresStore::connect(&args.database_url, 4).await?;
    let (db, connection) =
        tokio_postgres::connect(&args.database_url, tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    db.batch_execute(
        "CREATE TABLE IF NOT EXISTS inventory_counts (
            id bigserial PRIMARY KEY, aisle text NOT NULL, counted integer NOT NULL,
            holder text NOT NULL, revision bigint NOT NULL)",
    )
    .await?;
    let proxy = Client::new(&args.proxy)?;
    let opts = |holder: &str| {
        AcquireOptions::new(holder, Duration::from_secs(10)).wait(Duration::from_secs(15))
    };

    let first = proxy.acquire(&args.aisle, opts("robot-1")).await?;
    let first_token = verified(&keys, &first)?;
    println!("robot-1 holds {} with token {first_token}", args.aisle);
    for counted in [40, 41, 39] {
        count(&store, &args.aisle, "robot-1", first_token, counted).await?;
        println!("robot-1 counted {counted}: committed with the fence check");
    }
    // robot-1 stalls; its lease is released (or lapses) and robot-2 takes the aisle over.
    first.release().await?;
    let second = proxy.acquire(&args.aisle, opts("robot-2")).await?;
    let second_token = verified(&keys, &second)?;
    println!("robot-2 holds {} with token {second_token}", args.aisle);
    count(&store, &args.aisle, "robot-2", second_token, 38).await?;
    println!("robot-2 counted 38: committed");
    // robot-1 wakes up and sends its late count with its old token.
    match count(&store, &args.aisle, "robot-1", first_token, 40).await {
        Err(FencedError::Stale { token, mark }) => {
            println!("robot-1's late count refused by the database: token {token} < mark {mark}")
        }
        other => return Err(format!("a stale count was not refused: {other:?}").into()),
    }
    second.release().await?;
    Ok(())
}

fn verified(keys: &Keyring, lease: &Lease) -> Result<Token, Failure> {
    Ok(keys.verify(lease.resource(), lease.fencing_token())?)
}

/// One inventory update, committed only if `token` is not below the aisle's mark.
async fn count(
    store: &PostgresStore,
    aisle: &str,
    holder: &str,
    token: Token,
    counted: i32,
) -> Result<u64, FencedError<tokio_postgres::Error>> {
    let (aisle_row, holder) = (aisle.to_owned(), holder.to_owned());
    let revision = i64::try_from(token.revision).unwrap_or(i64::MAX);
    store
        .fenced(aisle, token, move |tx| {
            Box::pin(async move {
                tx.execute(
                    "INSERT INTO inventory_counts (aisle, counted, holder, revision) VALUES ($1, $2, $3, $4)",
                    &[&aisle_row, &counted, &holder, &revision],
                )
                .await
            })
        })
        .await
}
