//! Attacks on fencing inside PostgreSQL and on the marks the gateways share, each as it was
//! found: `tests/pg/hostile.sql` from psql (partitions and inheritance children of a protected
//! table, a resource expression under the writer's date and time settings, an explicit admit in
//! a trigger-mode transaction; the output must be `tests/pg/hostile.out`, `BLESS=1` rewrites
//! it); a gateway started beside marks it cannot account for; `pg` commands held up by
//! whoever takes their lock; an install moving a live package's marks or trusting a writer that
//! can act as the owner; prepared transactions and tables attached later on a cluster of the
//! test's own (a superuser's install there).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod pg;

use std::time::Duration;

use fencing::{HighWaterMarks, Keyring, PostgresStore, Token};
use lease_proxy_testkit::postgres::PrivatePostgres;
use pg::{key_file, psql, Scratch};

/// The tokens hostile.sql uses, by psql variable name.
fn tokens(k1: &Keyring) -> Vec<(String, String)> {
    let t = Token::new;
    [
        ("a1_5", k1.mint("aisle-1", t(0, 5))),
        ("a1_7", k1.mint("aisle-1", t(0, 7))),
        ("day_5", k1.mint("day-2026-12-06", t(0, 5))),
        ("day_7", k1.mint("day-2026-12-06", t(0, 7))),
        ("day_german", k1.mint("day-06.12.2026", t(0, 9))),
        ("slot_tokyo", k1.mint("slot-20261206T0900", t(0, 1))),
        ("slot_utc", k1.mint("slot-20261206T0000", t(0, 1))),
    ]
    .into_iter()
    .map(|(n, v)| (n.to_owned(), v))
    .collect()
}

#[tokio::test]
async fn attacks_on_protected_tables_are_refused() {
    let scratch = Scratch::new().await;
    let dir = tempfile::tempdir().unwrap();
    let (keys_path, keys) = key_file(dir.path(), "k1", &["k1"]);
    let installed = scratch.install(&[]);
    assert!(installed.status.success(), "{}", pg::text(&installed));
    scratch.sync_keys(&keys_path);
    let mut vars = tokens(&keys);
    vars.push(("app".to_owned(), scratch.role("app")));
    vars.push(("table_owner".to_owned(), scratch.role("tab")));
    pg::run_and_compare(
        &scratch,
        "tests/pg/hostile.sql",
        &vars,
        &[],
        "tests/pg/hostile.out",
    );
}

/// Tables a tenant with `CREATE` on `public` made there, as the store makes its own.
const PLANTED: &str =
    "CREATE TABLE public.fence_marks (resource text PRIMARY KEY, mark bytea NOT NULL);
    CREATE TABLE public.fence_inflight (id bigint PRIMARY KEY, resource text NOT NULL,
        token bytea NOT NULL, expires_at timestamptz NOT NULL);
    CREATE INDEX fence_inflight_by_resource ON public.fence_inflight (resource, token);
    CREATE TABLE public.fence_probe (id smallint PRIMARY KEY, probed_at timestamptz NOT NULL);
    GRANT ALL ON public.fence_marks, public.fence_inflight, public.fence_probe TO PUBLIC;";

/// `url` with the session's search_path set to `schema`.
fn on_path(url: &str, schema: &str) -> String {
    format!("{url}?options=-csearch_path%3D{schema}")
}

/// fence-gateway's store never starts beside a set of marks of its deployment that it does not
/// use: tables planted in `public` by a tenant, found first on the installing role's
/// search_path while the package's marks are in `fencing`; the package's marks after `pg
/// uninstall`; this deployment's marks made by a gateway in another schema. What it accounts
/// for does not stop it: the planted tables beside the package's marks it uses, another
/// deployment's marks (other keys).
#[tokio::test]
async fn a_store_never_starts_beside_marks_of_its_deployment_it_does_not_use() {
    let scratch = Scratch::new().await;
    let dir = tempfile::tempdir().unwrap();
    let (keys_path, keys) = key_file(dir.path(), "k1", &["k1"]);
    let (_, other_keys) = key_file(dir.path(), "k9", &["k9"]);
    let (_, third_keys) = key_file(dir.path(), "k5", &["k5"]);
    assert!(scratch.install(&[]).status.success());
    scratch.sync_keys(&keys_path);
    let db = pg::connect(&scratch.url()).await;
    db.batch_execute(
        "INSERT INTO fencing.fence_marks VALUES ('aisle-1', '\\x00000000000000000000000000000007')",
    )
    .await
    .unwrap();
    let stamp: String = db
        .query_one(
            "SELECT obj_description('fencing.fence_marks'::regclass, 'pg_class')",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(stamp.contains(&keys.marks_tags()[0]), "{stamp}");
    let planted = psql(
        &scratch.admin,
        &scratch.role("app"),
        &scratch.name,
        PLANTED,
        &[],
        &[],
    );
    assert!(!planted.contains("ERROR"), "{planted}");
    let deadline = Duration::from_secs(5);
    let refused = PostgresStore::connect_for(&scratch.url(), 1, deadline, &keys)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("fence_marks in schema fencing"),
        "{refused}"
    );
    let refused = PostgresStore::connect_with_deadline(&scratch.url(), 1, deadline)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("fence_marks in schema fencing"),
        "{refused}"
    );
    // The gateway role, its search_path set by the install, uses the package's marks: the
    // tenant's tables do not stop it.
    let store =
        PostgresStore::connect_for(&scratch.url_as(&scratch.role("gw")), 1, deadline, &keys)
            .await
            .unwrap();
    assert_eq!(store.get("aisle-1").await.unwrap(), Some(Token::new(0, 7)));
    drop(store);

    // After `pg uninstall` the marks stay, and stay the package's.
    let dropped = psql(
        &scratch.admin,
        &scratch.role("app"),
        &scratch.name,
        "DROP TABLE public.fence_marks, public.fence_inflight, public.fence_probe;",
        &[],
        &[],
    );
    assert!(!dropped.contains("ERROR"), "{dropped}");
    let url = scratch.url();
    let removed = pg::gateway(&["pg", "uninstall", "--database-url", &url]);
    assert!(removed.status.success(), "{}", pg::text(&removed));
    for keyed in [true, false] {
        let refused = if keyed {
            PostgresStore::connect_for(&url, 1, deadline, &keys).await
        } else {
            PostgresStore::connect_with_deadline(&url, 1, deadline).await
        }
        .unwrap_err()
        .to_string();
        assert!(
            refused.contains("fence_marks in schema fencing"),
            "{refused}"
        );
    }
    let public: bool = db
        .query_one("SELECT to_regclass('public.fence_marks') IS NULL", &[])
        .await
        .unwrap()
        .get(0);
    assert!(public, "a second set of marks was made in public");

    // A gateway of this deployment in a schema of its own makes and stamps a set there; another
    // of the same deployment elsewhere refuses, one of another deployment (other keys) starts.
    db.batch_execute("CREATE SCHEMA east; CREATE SCHEMA west")
        .await
        .unwrap();
    let east = PostgresStore::connect_for(&on_path(&url, "east"), 1, deadline, &other_keys)
        .await
        .unwrap();
    drop(east);
    let refused = PostgresStore::connect_for(&on_path(&url, "west"), 1, deadline, &other_keys)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("fence_marks in schema east")
            && refused.contains("this deployment's keys"),
        "{refused}"
    );
    PostgresStore::connect_for(&on_path(&url, "west"), 1, deadline, &third_keys)
        .await
        .unwrap();
}

/// Every `pg` command waits for a lock at most `--lock-timeout`, then fails naming who holds it
/// (pid, user, application_name): the package's advisory lock, which any role that can connect
/// may take, before the first install; once installed the package's own lock is its version
/// table's, which that role cannot take. `pg uninstall` behind an open admitted transaction
/// gives up at its deadline, naming it, and meanwhile admits of other resources go on, each
/// delayed a fraction of a second, not queued behind it until it gives up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_commands_wait_for_a_lock_with_a_deadline_and_name_who_holds_it() {
    let scratch = Scratch::new().await;
    let dir = tempfile::tempdir().unwrap();
    let (keys_path, keys) = key_file(dir.path(), "k1", &["k1"]);
    let nobody = scratch.role("nobody");
    let blocker = pg::connect(&format!(
        "{}?application_name=blocker",
        scratch.url_as(&nobody)
    ))
    .await;
    let advisory =
        "BEGIN; SELECT pg_advisory_xact_lock(hashtextextended('lease-proxy/fencing/package', 0))";
    blocker.batch_execute(advisory).await.unwrap();
    let url = scratch.url();
    let install = |timeout: &str| {
        let mut args: Vec<String> = ["pg", "install", "--database-url", &url, "--owner"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        args.push(scratch.role("owner"));
        args.extend(["--writer".to_owned(), scratch.role("app")]);
        args.extend(["--lock-timeout".to_owned(), timeout.to_owned()]);
        args
    };
    let (refused, took) = pg::gateway_timed(install("1s")).join().unwrap();
    let said = pg::text(&refused);
    assert_eq!(refused.status.code(), Some(1), "{said}");
    assert!(took < Duration::from_secs(10), "{took:?}");
    assert!(
        said.contains("advisory lock")
            && said.contains(&format!("user {nobody}"))
            && said.contains("application_name \"blocker\"")
            && said.contains("pid "),
        "{said}"
    );
    blocker.batch_execute("ROLLBACK").await.unwrap();
    let (installed, _) = pg::gateway_timed(install("5s")).join().unwrap();
    assert!(installed.status.success(), "{}", pg::text(&installed));
    // Installed: the advisory lock held again holds up nothing.
    blocker.batch_execute(advisory).await.unwrap();
    let keys_arg = keys_path.display().to_string();
    let sync: Vec<String> = [
        "pg",
        "sync-keys",
        "--database-url",
        &url,
        "--key-file",
        &keys_arg,
        "--lock-timeout",
        "2s",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let (synced, _) = pg::gateway_timed(sync).join().unwrap();
    assert!(synced.status.success(), "{}", pg::text(&synced));
    blocker.batch_execute("ROLLBACK").await.unwrap();

    // An old holder's transaction, admitted and left open.
    let app = scratch.role("app");
    let holder = pg::connect(&format!("{}?application_name=holder", scratch.url_as(&app))).await;
    holder.batch_execute("BEGIN").await.unwrap();
    let token = keys.mint("aisle-1", Token::new(0, 5));
    holder
        .query_one("SELECT fencing.admit('aisle-1', $1)", &[&token])
        .await
        .unwrap();
    let uninstall: Vec<String> = [
        "pg",
        "uninstall",
        "--database-url",
        &url,
        "--lock-timeout",
        "3s",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let removal = pg::gateway_timed(uninstall);
    let writer = pg::connect(&scratch.url_as(&app)).await;
    writer
        .batch_execute("SET statement_timeout = '2s'")
        .await
        .unwrap();
    let mut slowest = Duration::ZERO;
    let mut admitted = 0;
    for revision in 1..=40 {
        if removal.is_finished() {
            break;
        }
        let token = keys.mint("aisle-2", Token::new(0, revision));
        let started = tokio::time::Instant::now();
        writer
            .query_one("SELECT fencing.admit('aisle-2', $1)", &[&token])
            .await
            .unwrap();
        slowest = slowest.max(started.elapsed());
        admitted += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (gave_up, took) = removal.join().unwrap();
    let said = pg::text(&gave_up);
    assert_eq!(gave_up.status.code(), Some(1), "{said}");
    assert!(took < Duration::from_secs(10), "{took:?}");
    assert!(
        said.contains(&format!("user {app}")) && said.contains("application_name \"holder\""),
        "{said}"
    );
    assert!(
        admitted >= 10,
        "{admitted} admits while the uninstall waited"
    );
    assert!(
        slowest < Duration::from_secs(1),
        "an admit waited {slowest:?} behind the uninstall"
    );
    holder.batch_execute("ROLLBACK").await.unwrap();
    let still: String = writer
        .query_one("SELECT fencing.mark('aisle-2')", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(still, format!("0:{admitted}"));
}

/// The install checks what a role can do, not its name: a writer (or gateway role) that is a
/// member of the owner role, directly or through another role, can act as the owner (`SET
/// ROLE`), write a mark down and read the keys — refused. And an install into another schema
/// never takes a package's marks (installed, or uninstalled: its marks stay its).
#[tokio::test]
async fn an_install_trusts_no_member_of_the_owner_and_moves_no_packages_marks() {
    let scratch = Scratch::new().await;
    let admin = pg::connect(&common::postgres_url()).await;
    let (owner, app, nobody) = (
        scratch.role("owner"),
        scratch.role("app"),
        scratch.role("nobody"),
    );
    for (grant, revoke) in [
        (
            format!("GRANT {owner} TO {app}"),
            format!("REVOKE {owner} FROM {app}"),
        ),
        (
            format!("GRANT {owner} TO {nobody}; GRANT {nobody} TO {app}"),
            format!("REVOKE {nobody} FROM {app}; REVOKE {owner} FROM {nobody}"),
        ),
    ] {
        admin.batch_execute(&grant).await.unwrap();
        let refused = scratch.install(&[]);
        assert_eq!(refused.status.code(), Some(64), "{}", pg::text(&refused));
        assert!(
            pg::text(&refused).contains("member of it"),
            "{}",
            pg::text(&refused)
        );
        admin.batch_execute(&revoke).await.unwrap();
    }
    let installed = scratch.install(&[]);
    assert!(installed.status.success(), "{}", pg::text(&installed));

    let db = pg::connect(&scratch.url()).await;
    db.batch_execute(
        "INSERT INTO fencing.fence_marks VALUES ('aisle-1', '\\x00000000000000000000000000000007')",
    )
    .await
    .unwrap();
    let mark = || async {
        db.query_one("SELECT fencing.mark('aisle-1')", &[])
            .await
            .map(|r| r.get::<_, Option<String>>(0))
    };
    let refused = scratch.install(&["--schema", "other"]);
    assert_eq!(refused.status.code(), Some(1), "{}", pg::text(&refused));
    assert!(
        pg::text(&refused).contains("schema fencing holds the fencing package's marks"),
        "{}",
        pg::text(&refused)
    );
    assert_eq!(mark().await.unwrap().as_deref(), Some("0:7"));
    let url = scratch.url();
    let removed = pg::gateway(&["pg", "uninstall", "--database-url", &url]);
    assert!(removed.status.success(), "{}", pg::text(&removed));
    let refused = scratch.install(&["--schema", "other"]);
    assert_eq!(refused.status.code(), Some(1), "{}", pg::text(&refused));
    assert!(
        pg::text(&refused).contains("(uninstalled)"),
        "{}",
        pg::text(&refused)
    );
    let kept: bool = db
        .query_one("SELECT to_regclass('fencing.fence_marks') IS NOT NULL", &[])
        .await
        .unwrap()
        .get(0);
    assert!(kept);
}

/// On a server of the test's own where transactions can be prepared (`max_prepared_transactions
/// = 4`), the package installed by a superuser. An old holder's admitted transaction cannot be
/// PREPAREd (it would keep the mark row locked past every timeout, and every new holder's raise
/// would wait for it): PostgreSQL refuses, the transaction is gone, the new holder's raise goes
/// through. A partition created or attached, or an inheritance child added, under a protected
/// table after `protect` is protected at once by the install's event trigger — its TRUNCATE
/// refused, its rows fenced — and DDL elsewhere, by a role without the package's grants, is
/// not held up.
#[tokio::test]
async fn a_superusers_install_on_a_server_that_prepares_transactions() {
    let server = PrivatePostgres::start(&[("max_prepared_transactions", "4")]);
    let admin = pg::connect(&server.superuser_url()).await;
    admin
        .batch_execute("CREATE ROLE writer LOGIN; CREATE ROLE tab LOGIN; CREATE ROLE other LOGIN")
        .await
        .unwrap();
    // Not in a transaction block: a statement of its own.
    admin.batch_execute("CREATE DATABASE app").await.unwrap();
    let url = server.url("postgres", "app");
    let dir = tempfile::tempdir().unwrap();
    let (keys_path, keys) = key_file(dir.path(), "k1", &["k1"]);
    let keys_arg = keys_path.display().to_string();
    let installed = pg::gateway(&[
        "pg",
        "install",
        "--database-url",
        &url,
        "--writer",
        "writer",
        "--writer",
        "tab",
    ]);
    assert!(
        pg::text(&installed).contains("protected at once (event trigger)"),
        "{}",
        pg::text(&installed)
    );
    let synced = pg::gateway(&[
        "pg",
        "sync-keys",
        "--database-url",
        &url,
        "--key-file",
        &keys_arg,
    ]);
    assert!(synced.status.success(), "{}", pg::text(&synced));
    pg::connect(&url)
        .await
        .batch_execute("GRANT CREATE ON SCHEMA public TO tab, other")
        .await
        .unwrap();

    let old = pg::connect(&server.url("writer", "app")).await;
    old.batch_execute("BEGIN").await.unwrap();
    let token = keys.mint("aisle-1", Token::new(0, 5));
    old.query_one("SELECT fencing.admit('aisle-1', $1)", &[&token])
        .await
        .unwrap();
    let refused = old
        .batch_execute("PREPARE TRANSACTION 'old-holder'")
        .await
        .unwrap_err();
    assert_eq!(
        refused.code().map(|c| c.code()),
        Some("0A000"),
        "{refused:?}"
    );
    let new = pg::connect(&server.url("writer", "app")).await;
    new.batch_execute("SET lock_timeout = '2s'").await.unwrap();
    let token = keys.mint("aisle-1", Token::new(0, 7));
    let raised: String = new
        .query_one("SELECT fencing.admit('aisle-1', $1)", &[&token])
        .await
        .unwrap()
        .get(0);
    assert_eq!(raised, "0:7");
    let prepared: i64 = new
        .query_one("SELECT count(*) FROM pg_prepared_xacts", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(prepared, 0);

    let tab = pg::connect(&server.url("tab", "app")).await;
    tab.batch_execute(
        "CREATE TABLE events (aisle text NOT NULL, n int) PARTITION BY LIST (aisle);
         CREATE TABLE events_1 PARTITION OF events FOR VALUES IN ('aisle-1');
         SELECT fencing.protect('events', 'aisle');
         CREATE TABLE events_2 PARTITION OF events FOR VALUES IN ('aisle-2');
         CREATE TABLE events_3 (aisle text NOT NULL, n int);
         ALTER TABLE events ATTACH PARTITION events_3 FOR VALUES IN ('aisle-3');
         CREATE TABLE stock (aisle text NOT NULL, n int);
         SELECT fencing.protect('stock', 'aisle');
         CREATE TABLE stock_west () INHERITS (stock);
         CREATE TABLE stock_east (aisle text NOT NULL, n int);
         ALTER TABLE stock_east INHERIT stock;
         GRANT ALL ON events, events_2, events_3, stock, stock_west, stock_east TO writer;",
    )
    .await
    .unwrap();
    // The new holder's rows in the tables added, then writes without a token.
    new.batch_execute(&format!(
        "BEGIN; SET LOCAL fencing.token = '{token}';
         INSERT INTO stock_west VALUES ('aisle-1', 7); INSERT INTO stock_east VALUES ('aisle-1', 7);
         COMMIT"
    ))
    .await
    .unwrap();
    for (statement, code) in [
        ("TRUNCATE events_2", "0AF01"),
        ("TRUNCATE events_3", "0AF01"),
        ("TRUNCATE stock_east", "0AF01"),
        ("INSERT INTO events_3 VALUES ('aisle-3', 1)", "28F05"),
        ("INSERT INTO stock_west VALUES ('aisle-1', 1)", "28F05"),
        ("UPDATE stock SET n = 1", "28F05"),
    ] {
        let done = new.batch_execute(statement).await;
        let got = done.as_ref().err().and_then(|e| e.code()).map(|c| c.code());
        assert_eq!(got, Some(code), "{statement}: {done:?}");
    }
    let unguarded: Option<String> = pg::connect(&url)
        .await
        .query_one(
            "SELECT coalesce(fencing._unguarded_under('events'), fencing._unguarded_under('stock'))::text",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(unguarded, None);
    pg::connect(&server.url("other", "app"))
        .await
        .batch_execute("CREATE TABLE unrelated (x int); ALTER TABLE unrelated ADD COLUMN y int")
        .await
        .unwrap();
}

/// An install names the protected tables whose owners should run `protect` again: one protected
/// by an older version (its row trigger with two arguments, no statement trigger), one with a
/// table added under it since.
#[tokio::test]
async fn an_install_names_the_tables_to_protect_again() {
    let scratch = Scratch::new().await;
    assert!(scratch.install(&[]).status.success());
    let tab = pg::connect(&scratch.url_as(&scratch.role("tab"))).await;
    tab.batch_execute(
        "CREATE TABLE legacy (aisle text);
         CREATE TRIGGER fence_guard AFTER INSERT OR UPDATE OR DELETE ON legacy FOR EACH ROW
             EXECUTE FUNCTION fencing.row_guard('aisle', 'SELECT ($1).aisle::text');
         CREATE TRIGGER fence_guard_truncate BEFORE TRUNCATE ON legacy
             FOR EACH STATEMENT EXECUTE FUNCTION fencing.refuse_truncate();
         CREATE TABLE parent (aisle text); SELECT fencing.protect('parent', 'aisle');
         CREATE TABLE child () INHERITS (parent);
         CREATE TABLE fine (aisle text); SELECT fencing.protect('fine', 'aisle');",
    )
    .await
    .unwrap();
    let again = scratch.install(&[]);
    let said = pg::text(&again);
    assert!(again.status.success(), "{said}");
    assert!(
        said.contains(
            "run fencing.protect again (as each table's owner) on public.legacy, public.parent:"
        ),
        "{said}"
    );
}

/// The SQLSTATE of what `sql` did as the client `db`: `None` if it succeeded.
async fn refusal(db: &tokio_postgres::Client, sql: &str) -> Option<String> {
    db.batch_execute(sql).await.err().map(|e| {
        e.code()
            .map_or_else(|| e.to_string(), |c| c.code().to_owned())
    })
}

/// What `fencing.admit(resource, wire)` answers as the client `db`: the token admitted, or the
/// SQLSTATE of the refusal (autocommit).
async fn admit(db: &tokio_postgres::Client, resource: &str, wire: &str) -> Result<String, String> {
    db.query_one("SELECT fencing.admit($1, $2)", &[&resource, &wire])
        .await
        .map(|r| r.get(0))
        .map_err(|e| {
            e.code()
                .map_or_else(|| e.to_string(), |c| c.code().to_owned())
        })
}

/// The remembered verdicts of `resource`, counted as the installing role.
async fn remembered(scratch: &Scratch, resource: &str) -> i64 {
    let db = pg::connect(&scratch.url()).await;
    db.batch_execute(&format!("SET ROLE {}", scratch.role("owner")))
        .await
        .unwrap();
    db.query_one(
        "SELECT count(*) FROM fencing.verdicts WHERE resource = $1",
        &[&resource],
    )
    .await
    .unwrap()
    .get(0)
}

/// A remembered verdict (`fencing.verdicts`: a token that verified once is not verified again)
/// cannot be planted: a writer and a gateway role can neither write the table nor call the
/// functions that do; a writer's own `=` on text first on its search_path (made so that a forged
/// token equals a remembered one) is never called by the package; a forged token in the claim of
/// a trigger-mode transaction is verified, and refused.
#[tokio::test]
async fn a_remembered_verdict_cannot_be_planted() {
    let scratch = Scratch::new().await;
    let dir = tempfile::tempdir().unwrap();
    let (keys_path, keys) = key_file(dir.path(), "k1", &["k1"]);
    let installed = scratch.install(&[]);
    assert!(installed.status.success(), "{}", pg::text(&installed));
    scratch.sync_keys(&keys_path);
    // A key of the same id that the database does not have: well-formed, forged tokens.
    let (_, forger) = key_file(dir.path(), "forged", &["k1"]);
    let valid = keys.mint("aisle-1", Token::new(0, 5));
    let forged = forger.mint("aisle-1", Token::new(0, 5));
    let app = pg::connect(&scratch.url_as(&scratch.role("app"))).await;
    let gw = pg::connect(&scratch.url_as(&scratch.role("gw"))).await;
    assert_eq!(admit(&app, "aisle-1", &valid).await.as_deref(), Ok("0:5"));
    assert_eq!(remembered(&scratch, "aisle-1").await, 1);

    for db in [&app, &gw] {
        for sql in [
            "INSERT INTO fencing.verdicts (resource, wire, kid, token, shown) SELECT 'aisle-2', wire, kid, token, shown FROM fencing.verdicts",
            "INSERT INTO fencing.verdicts (resource, wire, kid, token, shown) VALUES ('aisle-2', 'x', 'k1', '\\x00000000000000000000000000000005', '0:5')",
            "UPDATE fencing.verdicts SET resource = 'aisle-2'",
            "DELETE FROM fencing.verdicts",
            "TRUNCATE fencing.verdicts",
            "SELECT * FROM fencing._verified('aisle-2', 'v1.k1.0.5.x.y')",
            "SELECT fencing._recall('aisle-1', 'v1.k1.0.5.x.y')",
        ] {
            assert_eq!(refusal(db, sql).await.as_deref(), Some("42501"), "{sql}");
        }
    }
    assert_eq!(remembered(&scratch, "aisle-2").await, 0);

    // The writer's own text equality, first on its search_path: every wire text would equal
    // the remembered one.
    let planted = "CREATE FUNCTION public.same(text, text) RETURNS boolean LANGUAGE sql AS
             $$ SELECT true $$;
         CREATE OPERATOR public.= (LEFTARG = text, RIGHTARG = text, FUNCTION = public.same);
         SET search_path = public, pg_catalog;";
    assert_eq!(refusal(&app, planted).await, None);
    assert_eq!(admit(&app, "aisle-1", &forged).await, Err("28F03".into()));
    for claim in [forged.clone(), format!("{forged} {valid}")] {
        let sql = format!(
            "BEGIN; SET LOCAL fencing.token = '{claim}'; SELECT fencing.admit_presented('aisle-1')"
        );
        assert_eq!(
            refusal(&app, &sql).await.as_deref(),
            Some("28F03"),
            "{claim}"
        );
        app.batch_execute("ROLLBACK").await.unwrap();
    }
    assert_eq!(remembered(&scratch, "aisle-1").await, 1);
}

/// A remembered verdict admits only the very token that verified, for the resource it verified
/// for: the same token for another resource, and the same token with another key's id (both
/// keys in force), are verified in full and refused, in either mode.
#[tokio::test]
async fn a_remembered_verdict_is_not_reused_for_another_resource_or_key() {
    let scratch = Scratch::new().await;
    let dir = tempfile::tempdir().unwrap();
    let (keys_path, keys) = key_file(dir.path(), "k12", &["k1", "k2"]);
    let installed = scratch.install(&[]);
    assert!(installed.status.success(), "{}", pg::text(&installed));
    scratch.sync_keys(&keys_path);
    let app = pg::connect(&scratch.url_as(&scratch.role("app"))).await;
    let valid = keys.mint("aisle-1", Token::new(0, 5));
    for _ in 0..2 {
        assert_eq!(admit(&app, "aisle-1", &valid).await.as_deref(), Ok("0:5"));
    }
    assert_eq!(remembered(&scratch, "aisle-1").await, 1);

    assert_eq!(admit(&app, "aisle-2", &valid).await, Err("28F04".into()));
    let sql = format!(
        "BEGIN; SET LOCAL fencing.token = '{valid}'; SELECT fencing.admit_presented('aisle-2')"
    );
    assert_eq!(refusal(&app, &sql).await.as_deref(), Some("28F04"));
    app.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(remembered(&scratch, "aisle-2").await, 0);

    let other_key = pg::with_segment(&valid, 1, "k2");
    assert_eq!(
        admit(&app, "aisle-1", &other_key).await,
        Err("28F03".into())
    );
    let sql = format!(
        "BEGIN; SET LOCAL fencing.token = '{other_key}'; SELECT fencing.admit_presented('aisle-1')"
    );
    assert_eq!(refusal(&app, &sql).await.as_deref(), Some("28F03"));
    app.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(remembered(&scratch, "aisle-1").await, 1);
}

/// `pg sync-keys` takes the remembered verdicts of every key it removes or replaces with it: a
/// token remembered under a key the file no longer has is refused as unknown, one remembered
/// under a key whose secret changed as forged; a key kept as it was verifies again.
#[tokio::test]
async fn a_remembered_verdict_is_gone_once_sync_keys_removes_its_key() {
    let scratch = Scratch::new().await;
    let dir = tempfile::tempdir().unwrap();
    let (k1_path, k1) = key_file(dir.path(), "k1", &["k1"]);
    let (k2_only, k2) = key_file(dir.path(), "k2", &["k2"]);
    let both = dir.path().join("k12");
    std::fs::write(
        &both,
        std::fs::read_to_string(&k1_path).unwrap() + &std::fs::read_to_string(&k2_only).unwrap(),
    )
    .unwrap();
    let installed = scratch.install(&[]);
    assert!(installed.status.success(), "{}", pg::text(&installed));
    scratch.sync_keys(&both);
    let app = pg::connect(&scratch.url_as(&scratch.role("app"))).await;
    let by_k1 = k1.mint("aisle-1", Token::new(0, 5));
    let by_k2 = k2.mint("aisle-2", Token::new(0, 5));
    for (resource, wire) in [("aisle-1", &by_k1), ("aisle-2", &by_k2)] {
        assert_eq!(admit(&app, resource, wire).await.as_deref(), Ok("0:5"));
        assert_eq!(remembered(&scratch, resource).await, 1);
    }

    scratch.sync_keys(&k2_only);
    assert_eq!(remembered(&scratch, "aisle-1").await, 0);
    assert_eq!(admit(&app, "aisle-1", &by_k1).await, Err("28F02".into()));
    assert_eq!(admit(&app, "aisle-2", &by_k2).await.as_deref(), Ok("0:5"));

    // k2 again, with another secret.
    let (k2_new, _) = key_file(dir.path(), "k2-new", &["k2"]);
    scratch.sync_keys(&k2_new);
    assert_eq!(remembered(&scratch, "aisle-2").await, 0);
    assert_eq!(admit(&app, "aisle-2", &by_k2).await, Err("28F03".into()));
}

/// A verdict reached under a key that `pg sync-keys` has replaced since is never remembered: a
/// REPEATABLE READ transaction whose snapshot predates the sync still sees the old secret, and
/// its first admit of a token signed with it must not leave a verdict that later transactions
/// would trust under the new secret. The key row it verified under is gone: locking it (the
/// admit's own lock, and the verdict's foreign key check) fails with PostgreSQL's 40001.
#[tokio::test]
async fn a_verdict_from_a_snapshot_older_than_the_keys_is_not_remembered() {
    let scratch = Scratch::new().await;
    let dir = tempfile::tempdir().unwrap();
    let (old_path, old) = key_file(dir.path(), "old", &["k1"]);
    let (new_path, _) = key_file(dir.path(), "new", &["k1"]);
    let installed = scratch.install(&[]);
    assert!(installed.status.success(), "{}", pg::text(&installed));
    scratch.sync_keys(&old_path);
    // The mark at 0:5 without an admit (which would remember the token).
    let owner = pg::connect(&scratch.url()).await;
    owner
        .batch_execute(&format!(
            "SET ROLE {}; INSERT INTO fencing.fence_marks VALUES
                 ('aisle-1', '\\x00000000000000000000000000000005')",
            scratch.role("owner")
        ))
        .await
        .unwrap();
    let token = old.mint("aisle-1", Token::new(0, 5));
    let app = pg::connect(&scratch.url_as(&scratch.role("app"))).await;
    app.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1")
        .await
        .unwrap();
    scratch.sync_keys(&new_path);
    let answer = admit(&app, "aisle-1", &token).await;
    let _ = app.batch_execute("COMMIT").await;
    assert_eq!(answer, Err("40001".into()));
    assert_eq!(remembered(&scratch, "aisle-1").await, 0);
    assert_eq!(admit(&app, "aisle-1", &token).await, Err("28F03".into()));
}

/// A caller's collation decides nothing: `Orders` and `orders` are two resources even when the
/// name is passed under a case-insensitive (nondeterministic) collation, so a token remembered
/// for one is not admitted for the other, and neither one's mark is read for the other.
#[tokio::test]
async fn a_callers_collation_does_not_make_two_resources_one() {
    let scratch = Scratch::new().await;
    let dir = tempfile::tempdir().unwrap();
    let (keys_path, keys) = key_file(dir.path(), "k1", &["k1"]);
    let installed = scratch.install(&[]);
    assert!(installed.status.success(), "{}", pg::text(&installed));
    scratch.sync_keys(&keys_path);
    let app = pg::connect(&scratch.url_as(&scratch.role("app"))).await;
    let upper = keys.mint("Orders", Token::new(0, 5));
    assert_eq!(admit(&app, "Orders", &upper).await.as_deref(), Ok("0:5"));
    assert_eq!(remembered(&scratch, "Orders").await, 1);
    let lower = keys.mint("orders", Token::new(0, 9));
    assert_eq!(admit(&app, "orders", &lower).await.as_deref(), Ok("0:9"));
    app.batch_execute(
        "CREATE COLLATION pg_temp.ci (provider = icu, locale = 'und-u-ks-level2', \
         deterministic = false)",
    )
    .await
    .unwrap();
    let refused = app
        .query_one(
            "SELECT fencing.admit('orders' COLLATE pg_temp.ci, $1)",
            &[&upper],
        )
        .await
        .map(|r| r.get::<_, String>(0))
        .map_err(|e| e.code().map(|c| c.code().to_owned()));
    assert_eq!(refused, Err(Some("28F04".into())));
    let sql = format!(
        "BEGIN; SET LOCAL fencing.token = '{upper}'; \
         SELECT fencing.admit_presented('orders' COLLATE pg_temp.ci)"
    );
    assert_eq!(refusal(&app, &sql).await.as_deref(), Some("28F04"));
    app.batch_execute("ROLLBACK").await.unwrap();
    let mark: Option<String> = app
        .query_one("SELECT fencing.mark('orders' COLLATE pg_temp.ci)", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(mark.as_deref(), Some("0:9"));
}
