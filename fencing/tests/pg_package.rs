//! The in-database package (docs/POSTGRES.md) against a real PostgreSQL
//! (`FENCING_TEST_POSTGRES`), from plain SQL clients: one `psql` process runs every case of
//! `tests/pg/cases.sql` — as a writer, a role without grants, a table owner and a gateway role —
//! and its output must be `tests/pg/cases.out` (`BLESS=1` rewrites it). Then the install itself:
//! adopting a gateway's tables, sharing marks with a running store, refusing a newer package,
//! uninstalling without lowering a mark; and a SQL raise waiting for a real `SharedGate`'s write
//! in flight; the SQL verification against `Keyring::verify` over every small mutation of a
//! token; how `protect` evaluates a resource expression; how a claim is split. Each test makes
//! its own database and roles and drops them. (Concurrent cases are in
//! sdk/python/tests/test_pg_fencing.py; attacks on the package in pg_hostile.rs.) Every test
//! shares the scratch database and the installed package (`Scratch`, in `pg/mod.rs`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod pg;

use fencing::{
    Admission, GateError, HighWaterMarks, KeyId, Keyring, PostgresStore, SharedGate, Token,
    TokenError,
};
use pg::{connect, gateway, key_file, psql, text, with_segment, Scratch, GATEWAY};

/// The tokens cases.sql uses, by psql variable name.
fn tokens(k1: &Keyring, k2: &Keyring, k3: &Keyring) -> Vec<(String, String)> {
    let t = Token::new;
    let mut out: Vec<(&str, String)> = vec![
        ("a1_5", k1.mint("aisle-1", t(0, 5))),
        ("a1_7", k1.mint("aisle-1", t(0, 7))),
        ("a1_9", k1.mint("aisle-1", t(0, 9))),
        ("a1_era1", k1.mint("aisle-1", t(1, 0))),
        ("a1_era2", k1.mint("aisle-1", t(2, 1))),
        ("a1_max_revision", k1.mint("aisle-1", t(0, u64::MAX))),
        ("a9_max", k1.mint("aisle-9", t(u64::MAX, u64::MAX))),
        (
            "lock_aisle_1",
            k1.mint(&fencing::lock_resource(b"aisle-1"), t(0, 9)),
        ),
        ("a4_5", k1.mint("aisle-4", t(0, 5))),
        ("a5_2", k1.mint("aisle-5", t(0, 2))),
        ("a5_3", k1.mint("aisle-5", t(0, 3))),
        ("a6_1", k1.mint("aisle-6", t(0, 1))),
        ("a3_k1", k1.mint("aisle-3", t(0, 1))),
        ("a3_k2", k2.mint("aisle-3", t(0, 1))),
        ("a3_k3", k3.mint("aisle-3", t(0, 2))),
    ];
    let a2 = k1.mint("aisle-2", t(0, 3));
    let other_ring = Keyring::parse(&Keyring::generate_file(&KeyId::parse("k1").unwrap()))
        .unwrap()
        .mint("aisle-2", t(0, 3));
    let tag = a2.split('.').nth(4).unwrap().to_owned();
    let mut trailing = tag.clone();
    // The last character of a 16-byte tag carries 4 unused bits; setting one is not canonical.
    let last = trailing.pop().unwrap();
    let bumped = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
        .chars()
        .nth(
            ("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
                .find(last)
                .unwrap()
                + 1)
                % 64,
        )
        .unwrap();
    trailing.push(bumped);
    out.extend([
        ("a2_forged_number", with_segment(&a2, 3, "4")),
        ("a2_other_ring", other_ring),
        ("a2_unknown_kid", with_segment(&a2, 1, "k7")),
        ("a2_leading_zero", with_segment(&a2, 3, "03")),
        ("a2_padded", with_segment(&a2, 4, &format!("{tag}=="))),
        ("a2_trailing_bits", with_segment(&a2, 4, &trailing)),
        ("a2_seven_parts", format!("{a2}.x")),
        ("a2_v2", with_segment(&a2, 0, "v2")),
        ("a2_too_big", with_segment(&a2, 2, "18446744073709551616")),
    ]);
    out.into_iter().map(|(n, v)| (n.to_owned(), v)).collect()
}

#[tokio::test]
async fn sql_clients_are_fenced_as_the_gateway_fences() {
    let scratch = Scratch::new().await;
    let dir = tempfile::tempdir().unwrap();
    let (k1_path, k1) = key_file(dir.path(), "k1", &["k1"]);
    let (k2_path, k2) = key_file(dir.path(), "k2", &["k2"]);
    let (k3_path, k3) = key_file(dir.path(), "k3", &["k3"]);
    // The rotated file: k3 signs, k2 still verifies.
    let rotated = dir.path().join("rotated");
    std::fs::write(
        &rotated,
        std::fs::read_to_string(&k3_path).unwrap() + &std::fs::read_to_string(&k2_path).unwrap(),
    )
    .unwrap();
    let bad = dir.path().join("bad");
    std::fs::write(&bad, "k9 not-a-secret\n").unwrap();

    let first = scratch.install(&[]);
    assert!(first.status.success(), "{}", text(&first));
    assert!(text(&first).contains("version 0 -> 3"), "{}", text(&first));
    let again = scratch.install(&[]);
    assert!(again.status.success(), "{}", text(&again));
    assert!(text(&again).contains("renewed"), "{}", text(&again));
    let url = scratch.url();
    scratch.sync_keys(&k1_path);

    let mut vars = tokens(&k1, &k2, &k3);
    for role in ["app", "nobody", "gw"] {
        vars.push((role.to_owned(), scratch.role(role)));
    }
    vars.push(("table_owner".to_owned(), scratch.role("tab")));
    vars.push(("installer".to_owned(), scratch.installer()));
    // For the `\!` commands, which inherit psql's environment.
    let env = [
        ("FENCE_GATEWAY", GATEWAY.to_owned()),
        ("DB_URL", url.clone()),
        ("KEYS_K1", k1_path.display().to_string()),
        ("KEYS_K2", k2_path.display().to_string()),
        ("KEYS_BAD", bad.display().to_string()),
        ("KEYS_ROTATED", rotated.display().to_string()),
    ];
    pg::run_and_compare(
        &scratch,
        "tests/pg/cases.sql",
        &vars,
        &env,
        "tests/pg/cases.out",
    );
}

#[tokio::test]
async fn the_install_adopts_a_gateways_tables_and_shares_its_marks() {
    let scratch = Scratch::new().await;
    // A gateway ran first (as the installing role): its tables are in public, with a mark.
    let before = PostgresStore::connect(&scratch.url(), 2).await.unwrap();
    before.raise("aisle-1", Token::new(0, 42)).await.unwrap();
    drop(before);
    let installed = scratch.install(&[]);
    assert!(installed.status.success(), "{}", text(&installed));
    assert!(
        text(&installed).contains("moved from schema public"),
        "{}",
        text(&installed)
    );
    let db = connect(&scratch.url()).await;
    let mark: Option<String> = db
        .query_one("SELECT fencing.mark('aisle-1')", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(mark.as_deref(), Some("0:42"));
    // The gateway, now as its own role (search_path set by the install), uses the moved tables
    // without creating anything, and its raises are the package's marks.
    let gateway_store = PostgresStore::connect(&scratch.url_as(&scratch.role("gw")), 2)
        .await
        .unwrap();
    assert_eq!(
        gateway_store.get("aisle-1").await.unwrap(),
        Some(Token::new(0, 42))
    );
    gateway_store
        .raise("aisle-1", Token::new(0, 43))
        .await
        .unwrap();
    let mark: Option<String> = db
        .query_one("SELECT fencing.mark('aisle-1')", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(mark.as_deref(), Some("0:43"));
    let public: bool = db
        .query_one("SELECT to_regclass('public.fence_marks') IS NULL", &[])
        .await
        .unwrap()
        .get(0);
    assert!(public, "two sets of marks");
    // A gateway still connecting as before (its search_path not reaching the package schema)
    // refuses to start rather than create a second, empty set of marks.
    let refused = PostgresStore::connect(&scratch.url(), 2).await.unwrap_err();
    assert!(
        refused
            .to_string()
            .contains("fence_marks in schema fencing"),
        "{refused}"
    );
    let public: bool = db
        .query_one("SELECT to_regclass('public.fence_marks') IS NULL", &[])
        .await
        .unwrap()
        .get(0);
    assert!(public, "two sets of marks");

    // A newer package is never downgraded.
    db.batch_execute("INSERT INTO fencing.package_version (version) VALUES (99)")
        .await
        .unwrap();
    let refused = scratch.install(&[]);
    assert_eq!(refused.status.code(), Some(1), "{}", text(&refused));
    assert!(text(&refused).contains("newer"), "{}", text(&refused));
    db.batch_execute("DELETE FROM fencing.package_version WHERE version = 99")
        .await
        .unwrap();

    // Version 2's verdicts (keyed by the wire text's SHA-256), with a row: the upgrade to 3
    // forgets them and keys the table by the wire text. A writer's views over the functions it
    // was granted do not stop the upgrade (no granted function is dropped or changes signature).
    connect(&scratch.url_as(&scratch.role("app")))
        .await
        .batch_execute(
            "CREATE VIEW public.pins AS SELECT fencing._resource_of('SELECT 1::text', ROW(1)) AS one
                 WHERE fencing._guard(NULL, NULL, NULL, NULL, NULL) IS NULL",
        )
        .await
        .unwrap();
    let v2 = include_str!("../src/indb/sql/v2.sql").replace("@schema@", "fencing");
    db.batch_execute(&format!(
        "DELETE FROM fencing.package_version WHERE version = 3;
         DROP TABLE fencing.verdicts;
         {v2}
         INSERT INTO fencing.keys (kid, secret, position) VALUES ('k2old', '\\x{:064}', 99);
         INSERT INTO fencing.verdicts VALUES ('aisle-1', sha256('x'), 'k2old', '\\x{:032}', '0:0');
         DO $$ BEGIN EXECUTE format('ALTER TABLE fencing.verdicts OWNER TO %I',
             (SELECT t.tableowner FROM pg_tables AS t
              WHERE t.schemaname = 'fencing' AND t.tablename = 'keys')); END $$;",
        0, 0
    ))
    .await
    .unwrap();
    let upgraded = scratch.install(&[]);
    assert!(upgraded.status.success(), "{}", text(&upgraded));
    assert!(
        text(&upgraded).contains("version 2 -> 3"),
        "{}",
        text(&upgraded)
    );
    let columns: Vec<String> = db
        .query(
            "SELECT a.attname::text FROM pg_attribute AS a
             WHERE a.attrelid = 'fencing.verdicts'::regclass AND a.attnum > 0
               AND NOT a.attisdropped ORDER BY a.attname",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(columns, ["kid", "resource", "shown", "token", "wire"]);
    let left: i64 = db
        .query_one("SELECT count(*) FROM fencing.verdicts", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(left, 0);
    db.batch_execute("DELETE FROM fencing.keys WHERE kid = 'k2old'")
        .await
        .unwrap();

    // Uninstall: refused while a table is protected; with --force the triggers go, the marks
    // stay; a new install finds them.
    let tab = connect(&scratch.url_as(&scratch.role("tab"))).await;
    tab.batch_execute("CREATE TABLE t (r text); SELECT fencing.protect('t', 'r');")
        .await
        .unwrap();
    let url = scratch.url();
    let uninstall = |force: bool| {
        let mut args = vec!["pg", "uninstall", "--database-url", &url];
        if force {
            args.push("--force");
        }
        gateway(&args)
    };
    let refused = uninstall(false);
    assert_eq!(refused.status.code(), Some(1), "{}", text(&refused));
    assert!(text(&refused).contains("protected"), "{}", text(&refused));
    let removed = uninstall(true);
    assert!(removed.status.success(), "{}", text(&removed));
    assert!(
        text(&removed).contains("no longer protected"),
        "{}",
        text(&removed)
    );
    let gone: bool = db
        .query_one(
            "SELECT to_regprocedure('fencing.admit(text, text)') IS NULL \
             AND NOT EXISTS (SELECT FROM pg_trigger WHERE tgrelid = 't'::regclass)",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(gone);
    let reinstalled = scratch.install(&[]);
    assert!(reinstalled.status.success(), "{}", text(&reinstalled));
    let mark: Option<String> = db
        .query_one("SELECT fencing.mark('aisle-1')", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(mark.as_deref(), Some("0:43"));
    drop(gateway_store);
}

/// A real fence-gateway store's write in flight (a `SharedGate` permit, registered in
/// `fence_inflight`) holds a SQL raise back until the write has ended; then the SQL transaction
/// commits, and the gateway refuses the old token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sql_raise_waits_for_a_gateways_write_in_flight() {
    let scratch = Scratch::new().await;
    let dir = tempfile::tempdir().unwrap();
    let (keys_path, keys) = key_file(dir.path(), "keys", &["k1"]);
    assert!(scratch.install(&[]).status.success());
    scratch.sync_keys(&keys_path);
    let gate = SharedGate::new(
        PostgresStore::connect(&scratch.url_as(&scratch.role("gw")), 2)
            .await
            .unwrap(),
    );
    let permit = gate.admit("aisle-1", Token::new(0, 5)).await.unwrap();

    let app_url = scratch.url_as(&scratch.role("app"));
    let token = keys.mint("aisle-1", Token::new(0, 6));
    let raise = tokio::spawn(async move {
        let mut app = connect(&app_url).await;
        let tx = app.transaction().await.unwrap();
        let admitted: String = tx
            .query_one("SELECT fencing.admit('aisle-1', $1)", &[&token])
            .await
            .unwrap()
            .get(0);
        tx.commit().await.unwrap();
        (admitted, tokio::time::Instant::now())
    });
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert!(
        !raise.is_finished(),
        "the SQL raise did not wait for the gateway's write in flight"
    );
    let ended = tokio::time::Instant::now();
    permit.complete();
    let (admitted, at) = raise.await.unwrap();
    assert_eq!(admitted, "0:6");
    assert!(at >= ended);
    match gate.admit("aisle-1", Token::new(0, 5)).await {
        Err(GateError::Stale { mark, .. }) => assert_eq!(mark, Token::new(0, 6)),
        other => panic!("the gateway admitted the old token: {:?}", other.map(drop)),
    }
    gate.drain().await;
}

/// What a tenant plants before or around an install runs nothing as the installing role or the
/// owner: a `hashtextextended(text, integer)` in `public`, on the
/// installer's search_path, which the command's own lock call would have resolved to; a
/// pgcrypto in a schema a tenant may create in (it could replace `hmac`); a `fence_marks` of the
/// tenant's, with its trigger, which the install would have adopted as the marks. And with the
/// settings row gone (its compare key NULL) nothing verifies, rather than everything.
#[tokio::test]
async fn the_install_trusts_nothing_a_tenant_planted() {
    let dir = tempfile::tempdir().unwrap();
    let (keys, k1) = key_file(dir.path(), "k1", &["k1"]);

    let scratch = Scratch::new().await;
    let (me, app) = (scratch.installer(), scratch.role("app"));
    let planted = psql(
        &scratch.admin,
        &app,
        &scratch.name,
        "CREATE TABLE public.loot(who text);
         GRANT SELECT, INSERT ON public.loot TO PUBLIC;
         CREATE FUNCTION public.hashtextextended(t text, seed integer) RETURNS bigint
             LANGUAGE plpgsql AS $$ BEGIN INSERT INTO public.loot VALUES (current_user);
             RETURN pg_catalog.hashtextextended(t, seed::bigint); END $$;
         GRANT EXECUTE ON FUNCTION public.hashtextextended(text, integer) TO PUBLIC;",
        &[],
        &[],
    );
    assert!(!planted.contains("ERROR"), "{planted}");
    let installed = scratch.install(&[]);
    assert!(installed.status.success(), "{}", text(&installed));
    scratch.sync_keys(&keys);
    let url = scratch.url();
    let db = connect(&url).await;
    let ran: i64 = db
        .query_one("SELECT count(*) FROM public.loot", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(ran, 0, "the planted function ran as {me}");

    // The settings row gone: a token is refused, not admitted.
    let token = k1.mint("aisle-1", Token::new(0, 5));
    let owner = scratch.role("owner");
    db.batch_execute(&format!(
        "SET ROLE {owner}; DELETE FROM fencing.settings; RESET ROLE"
    ))
    .await
    .unwrap();
    let refused = db
        .query_one("SELECT fencing.admit('aisle-1', $1)", &[&token])
        .await
        .unwrap_err();
    assert_eq!(refused.code().map(|c| c.code()), Some("55000"), "{refused}");

    // pgcrypto where a tenant may create (app has CREATE on public): refused.
    let scratch = Scratch::new().await;
    connect(&scratch.url())
        .await
        .batch_execute("CREATE EXTENSION pgcrypto SCHEMA public")
        .await
        .unwrap();
    let refused = scratch.install(&[]);
    assert!(!refused.status.success(), "{}", text(&refused));
    assert!(
        text(&refused).contains("pgcrypto is installed in schema public"),
        "{}",
        text(&refused)
    );

    // A tenant's own fence_marks, with a trigger: not adopted.
    let scratch = Scratch::new().await;
    let app = scratch.role("app");
    let planted = psql(
        &scratch.admin,
        &app,
        &scratch.name,
        "CREATE TABLE public.fence_marks (resource text PRIMARY KEY, mark bytea NOT NULL);
         CREATE FUNCTION public.steal() RETURNS trigger LANGUAGE plpgsql AS
             $$ BEGIN RETURN NEW; END $$;
         CREATE TRIGGER z BEFORE INSERT OR UPDATE ON public.fence_marks
             FOR EACH ROW EXECUTE FUNCTION public.steal();",
        &[],
        &[],
    );
    assert!(!planted.contains("ERROR"), "{planted}");
    let refused = scratch.install(&[]);
    assert!(!refused.status.success(), "{}", text(&refused));
    assert!(
        text(&refused).contains(&format!("public.fence_marks is owned by {app}")),
        "{}",
        text(&refused)
    );
}

/// The SQL verification (`_verify`), and what an admit remembers of it (`_verified`, asked
/// again for a valid token), give every token the verdict `Keyring::verify` gives it:
/// valid tokens at the edges of the numbers, and every one-character change, deletion and
/// insertion of a valid token, with characters from each class the parsers treat apart.
#[tokio::test]
async fn sql_verification_agrees_with_the_keyring_on_every_mutation() {
    let scratch = Scratch::new().await;
    let dir = tempfile::tempdir().unwrap();
    let (path, keys) = key_file(dir.path(), "keys", &["k1", "k_2-x"]);
    assert!(scratch.install(&[]).status.success());
    let url = scratch.url();
    scratch.sync_keys(&path);
    let db = connect(&url).await;
    let verdict = db
        .prepare("SELECT code FROM fencing._verify($1, $2)")
        .await
        .unwrap();

    let resource = "aisle-7";
    let mut wires: Vec<String> = Vec::new();
    for (era, revision) in [(0, 0), (1, 9), (u64::MAX, u64::MAX), (7, 1 << 63)] {
        wires.push(keys.mint(resource, Token::new(era, revision)));
    }
    wires.push(keys.mint("lock/6169736c652d37", Token::new(1, 2)));
    let valid = keys.mint(resource, Token::new(3, 41));
    let alphabet = [
        'A', 'Q', 'g', 'w', 'B', 'z', '0', '9', '-', '_', '.', '=', '+', '/', ' ', 'é',
    ];
    let chars: Vec<char> = valid.chars().collect();
    for i in 0..=chars.len() {
        for c in alphabet {
            let mut inserted = chars.clone();
            inserted.insert(i, c);
            wires.push(inserted.into_iter().collect());
            if i < chars.len() {
                let mut changed = chars.clone();
                changed[i] = c;
                wires.push(changed.into_iter().collect());
            }
        }
        if i < chars.len() {
            let mut deleted = chars.clone();
            deleted.remove(i);
            wires.push(deleted.into_iter().collect());
        }
    }
    for (i, value) in [
        (2, "18446744073709551615"),
        (2, "18446744073709551616"),
        (3, "99999999999999999999"),
        (3, "00"),
        (3, "+3"),
        (1, "k3"),
        (1, &"k".repeat(33)),
        (1, ""),
    ] {
        wires.push(with_segment(&valid, i, value));
    }
    wires.push(format!("{valid}{}", "A".repeat(300)));

    // `_verified` (the verdicts an admit remembers): verifying and remembering, then, for a
    // valid token, recalling; only the tokens that verify are remembered.
    let remembering = db
        .prepare("SELECT code FROM fencing._verified($1, $2)")
        .await
        .unwrap();
    let mut refused = 0;
    let mut valid = std::collections::BTreeSet::new();
    for wire in &wires {
        let expected = match keys.verify(resource, wire) {
            Ok(_) => None,
            Err(TokenError::Malformed) => Some("28F01"),
            Err(TokenError::UnknownKey) => Some("28F02"),
            Err(TokenError::BadSignature) => Some("28F03"),
            Err(TokenError::WrongResource) => Some("28F04"),
            Err(e) => panic!("{e}"),
        };
        refused += usize::from(expected.is_some());
        if expected.is_none() {
            valid.insert(wire.clone());
        }
        // A refusal is never remembered: asking again would verify again, as the first did.
        let asks = if expected.is_none() { 2 } else { 1 };
        for statement in std::iter::once(&verdict).chain(std::iter::repeat_n(&remembering, asks)) {
            let got: Option<String> = db
                .query_one(statement, &[&resource, wire])
                .await
                .unwrap()
                .get(0);
            assert_eq!(got.as_deref(), expected, "{wire}");
        }
    }
    assert!(
        refused > wires.len() / 2 && refused < wires.len(),
        "{refused} of {}",
        wires.len()
    );
    let remembered: i64 = db
        .query_one("SELECT count(*) FROM fencing.verdicts", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(usize::try_from(remembered).unwrap(), valid.len());
}

/// `protect` reads a bare column straight from the row only when the expression means that
/// column unquoted; a keyword (`current_user`), a name that is not stored as written (`Aisle`)
/// or any other expression is evaluated as an expression, whatever columns the table has.
#[tokio::test]
async fn protect_reads_a_column_directly_only_when_the_expression_is_that_column() {
    let scratch = Scratch::new().await;
    assert!(scratch.install(&[]).status.success());
    let db = connect(&scratch.url()).await;
    db.batch_execute(
        r#"CREATE TABLE odd (aisle text, "current_user" text, "Aisle" text, "lower(aisle)" text)"#,
    )
    .await
    .unwrap();
    for (expression, direct) in [
        ("aisle", true),
        ("current_user", false),
        ("Aisle", false),
        ("lower(aisle)", false),
    ] {
        db.execute("SELECT fencing.protect('odd', $1)", &[&expression])
            .await
            .unwrap();
        let query: String = db
            .query_one(
                "SELECT split_part(encode(tgargs, 'escape'), '\\000', 2) FROM pg_trigger
                 WHERE tgname = 'fence_guard' AND tgrelid = 'odd'::regclass",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        let expected = if direct {
            format!("SELECT ($1).{expression}::text")
        } else {
            format!("SELECT ({expression})::text FROM (SELECT ($1).*) AS fenced_row")
        };
        assert_eq!(query, expected, "{expression}");
    }
}

/// A claim in `fencing.token` is split on every run of whitespace and commas, wherever they are
/// (a leading tab or comma refused a genuine token as malformed), and a
/// hostile resource name does not make an error as long as itself.
#[tokio::test]
async fn a_claim_is_split_on_any_separators_and_refusals_stay_short() {
    let scratch = Scratch::new().await;
    let dir = tempfile::tempdir().unwrap();
    let (path, keys) = key_file(dir.path(), "keys", &["k1"]);
    assert!(scratch.install(&[]).status.success());
    let url = scratch.url();
    scratch.sync_keys(&path);
    let db = connect(&url).await;
    db.batch_execute(
        "CREATE TABLE claims (aisle text, n int); SELECT fencing.protect('claims', 'aisle');",
    )
    .await
    .unwrap();
    let mine = keys.mint("aisle-1", Token::new(1, 5));
    let other = keys.mint("aisle-2", Token::new(1, 5));
    let write = |claim: String| {
        let db = &db;
        async move {
            db.batch_execute("BEGIN").await.unwrap();
            db.execute("SELECT set_config('fencing.token', $1, true)", &[&claim])
                .await
                .unwrap();
            let done = db
                .execute("INSERT INTO claims VALUES ('aisle-1', 1)", &[])
                .await;
            db.batch_execute("ROLLBACK").await.unwrap();
            done.err()
                .map(|e| e.as_db_error().unwrap().code().code().to_owned())
        }
    };
    for claim in [
        format!("\t{mine}"),
        format!(",{mine}"),
        format!("{other},\n{mine},"),
        format!(" , {other}\r\n\t,{mine}\n"),
    ] {
        assert_eq!(write(claim.clone()).await, None, "{claim:?}");
    }
    assert_eq!(write(format!("{other},\n")).await.as_deref(), Some("28F04"));
    assert_eq!(write(",".into()).await.as_deref(), Some("28F05"));
    assert_eq!(write(" \t\n".into()).await.as_deref(), Some("28F05"));

    let huge = "a".repeat(1_000_000);
    let refused = db
        .query_one("SELECT fencing.admit($1, $2)", &[&huge, &mine])
        .await
        .unwrap_err();
    let db_error = refused.as_db_error().unwrap();
    assert_eq!(db_error.code().code(), "22F01");
    assert!(
        db_error.message().len() < 400,
        "{}",
        &db_error.message()[..400]
    );
    assert!(db_error
        .message()
        .ends_with("(1000000 characters) is not a fencing resource name"));
}

/// Every snippet of docs/POSTGRES.md, and README.md's psql transcript, run as written
/// (`pg/guide.rs`: how each is run) on a scratch database, in one psql process.
#[tokio::test]
async fn the_postgres_guide_runs_as_written() {
    use pg::guide;
    let scratch = Scratch::new().await;
    let dir = tempfile::tempdir().unwrap();
    let (keys_path, keys) = key_file(dir.path(), "fencing.key", &["k1"]);
    let url = scratch.url();
    let values = guide::Values {
        roles: [
            ("fencing_owner", scratch.role("docowner")),
            ("migrator", scratch.installer()),
            ("app", scratch.role("app")),
            ("app_owner", scratch.role("tab")),
            ("gateway", scratch.role("gw")),
            ("robot", scratch.role("robot")),
            ("proxy", scratch.role("proxy")),
        ]
        .into_iter()
        .collect(),
        strings: vec![
            ("postgres://migrator:…@db/app", url.clone()),
            ("postgres://migrator:…@db/warehouse", url.clone()),
            (
                "'v1.k1.0.4711.…'",
                format!("'{}'", keys.mint("aisle-7", Token::new(0, 4711))),
            ),
            ("fencing.key", keys_path.display().to_string()),
            ("fence-gateway pg", "\"$FENCE_GATEWAY\" pg".to_owned()),
        ],
    };
    let session_role = |role: &str| match role {
        "migrator" => scratch.installer(),
        "app" => scratch.role("app"),
        "app_owner" => scratch.role("tab"),
        other => panic!("no role {other:?} in the guide's test"),
    };
    let mut blocks = guide::blocks("docs/POSTGRES.md", true);
    blocks.extend(guide::blocks("README.md", false));
    // What the guide takes as there: the application's table, and the inventory's, made as the
    // inventory makes it.
    let inventory = std::fs::read_to_string("../examples/src/bin/warehouse/inventory.rs").unwrap();
    let applied = inventory
        .split("const SCHEMA: &str = \"")
        .nth(1)
        .and_then(|s| s.split("\";").next())
        .unwrap()
        .replace("seq INTEGER PRIMARY KEY", "seq BIGSERIAL PRIMARY KEY");
    let mut script = format!(
        "\\set SHOW_CONTEXT never\n\\pset pager off\n\\c - {tab}\n\
         CREATE TABLE stock (aisle int PRIMARY KEY, count int NOT NULL);\n\
         INSERT INTO stock VALUES (7, 40);\nGRANT SELECT, UPDATE ON stock TO {app};\n\
         \\c - {me}\n{applied};\n",
        tab = scratch.role("tab"),
        app = scratch.role("app"),
        me = scratch.installer(),
    );
    let mut failures = Vec::new();
    let help = |sub: &str| text(&gateway(&["pg", sub, "--help"]));
    script += &guide::script(&blocks, &values, session_role, help, &mut failures);
    let new = keys.mint("aisle-1", Token::new(0, 7));
    let old = keys.mint("aisle-1", Token::new(0, 5));
    let output = psql(
        &scratch.admin,
        &scratch.installer(),
        &scratch.name,
        &script,
        &[("new".to_owned(), new), ("old".to_owned(), old)],
        &[("FENCE_GATEWAY", GATEWAY.to_owned())],
    );
    guide::verdicts(&blocks, &output, &mut failures);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
