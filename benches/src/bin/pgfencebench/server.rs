//! What the server itself spends: an admit's parts, each side's transaction run inside the
//! server, and the mark's raise against a check of the current token.

use fencing::{Keyring, Token};
use lease_proxy_benches::stats::{ms, Run};
use tokio::time::Instant;
use tokio_postgres::Client;

use crate::sides::{Side, Worker, SIDES};

/// The server-side cost of an admit's parts: each expression evaluated 1,000 times in one
/// PL/pgSQL loop (so no round trip is counted), less the empty loop, in µs per call.
pub(crate) async fn breakdown(db: &Client, w: &Worker) -> anyhow::Result<Vec<(String, f64)>> {
    const N: u32 = 1000;
    let (aisle, token) = (w.aisle.as_str(), w.token.as_str());
    let lit = |s: &str| format!("'{}'", s.replace('\'', "''"));
    // Variables, not literals: an immutable function of constants would be folded once.
    let declare = format!(
        "DECLARE r text := {}; t text := {}; b bytea := '\\x00'; ok boolean;",
        lit(aisle),
        lit(token)
    );
    let parts = [
        "1",
        "fencing._is_resource(r)",
        "string_to_array(t, '.')",
        "fencing.hmac(b, b, 'sha256')",
        "fencing._verify(r, t)",
        "fencing._recall(r, t)",
        "fencing.admit(r, t)",
    ];
    let mut out = Vec::new();
    let mut empty = 0.0;
    for part in parts {
        let sql =
            format!("DO $$ {declare} BEGIN FOR i IN 1..{N} LOOP PERFORM {part}; END LOOP; END $$");
        db.batch_execute("BEGIN").await?;
        let t0 = Instant::now();
        db.batch_execute(&sql).await?;
        let us = t0.elapsed().as_secs_f64() * 1e6 / f64::from(N);
        db.batch_execute("COMMIT").await?;
        if part == "1" {
            empty = us;
            continue;
        }
        out.push((part.to_owned(), (us - empty).max(0.0)));
    }
    Ok(out)
}

/// Runs `n` transactions of a side inside the server, one after another (a procedure that
/// commits in its loop): no client, no round trip, commits not waiting for the disk.
const SERVER_LOOP: &str = "CREATE PROCEDURE bench_loop(side text, n int, a text, t text)
    LANGUAGE plpgsql AS $$
    DECLARE shown text; mark bytea;
    BEGIN
        FOR i IN 1..n LOOP
            IF side = 'temporal' THEN
                PERFORM s.range_id FROM shards AS s WHERE s.aisle = a FOR SHARE;
            ELSIF side = 'floor' THEN
                mark := bench_floor(a);
            ELSIF side = 'admit' THEN
                shown := fencing.admit(a, t);
            ELSIF side = 'trigger' THEN
                PERFORM set_config('fencing.token', t, true);
            ELSIF side <> 'unfenced' THEN
                RAISE EXCEPTION 'bench_loop: no side %', side;
            END IF;
            IF side = 'trigger' THEN
                UPDATE guarded SET qty = qty + 1 WHERE aisle = a;
            ELSE
                UPDATE stock SET qty = qty + 1 WHERE aisle = a;
            END IF;
            COMMIT;
        END LOOP;
    END $$";

/// The server's CPU per transaction of each side: `n` transactions in one server-side loop
/// ([`SERVER_LOOP`], each side by its [`Side::name`]), the rounds interleaved, the least time of the rounds (what the others lost
/// to the machine's other work), in µs per transaction. Without the client and the round trips
/// this is what each side asks of PostgreSQL itself.
pub(crate) async fn costs(
    db: &Client,
    w: &Worker,
    n: u32,
    rounds: usize,
) -> anyhow::Result<Vec<(Side, f64)>> {
    db.batch_execute(SERVER_LOOP).await?;
    db.batch_execute("SET synchronous_commit = off").await?;
    let call = |side: Side| {
        format!(
            "CALL bench_loop('{}', {n}, '{}', '{}')",
            side.name(),
            w.aisle,
            w.token
        )
    };
    let mut least = [f64::INFINITY; SIDES.len()];
    for round in 0..rounds {
        for k in 0..SIDES.len() {
            let i = (k + round) % SIDES.len();
            let t0 = Instant::now();
            db.batch_execute(&call(SIDES[i])).await?;
            let us = t0.elapsed().as_secs_f64() * 1e6 / f64::from(n);
            least[i] = least[i].min(us);
        }
    }
    db.batch_execute("RESET synchronous_commit").await?;
    Ok(SIDES.iter().copied().zip(least).collect())
}

/// `n` admits committed one at a time: each a new holder's (a higher token: the raise) or the
/// current holder's again (the check alone).
pub(crate) async fn raises(
    db: &Client,
    keys: &Keyring,
    n: usize,
    higher: bool,
) -> anyhow::Result<Run> {
    let resource = if higher { "raised" } else { "checked" };
    let current = keys.mint(resource, Token::new(1, 1));
    db.query_one("SELECT fencing.admit($1, $2)", &[&resource, &current])
        .await?;
    let started = Instant::now();
    let mut latencies = Vec::with_capacity(n);
    for i in 0..n {
        let token = if higher {
            keys.mint(resource, Token::new(1, u64::try_from(i).unwrap_or(0) + 2))
        } else {
            current.clone()
        };
        let t = Instant::now();
        db.batch_execute("BEGIN").await?;
        db.query_one("SELECT fencing.admit($1, $2)", &[&resource, &token])
            .await?;
        db.batch_execute("COMMIT").await?;
        latencies.push(t.elapsed());
    }
    Ok(Run::from_latencies(latencies, started.elapsed()))
}

/// The server-side tables and the raise, as markdown.
pub(crate) fn markdown(
    parts: &[(String, f64)],
    costs: &[(Side, f64)],
    check: &Run,
    raise: &Run,
) -> String {
    let mut md = String::from("\nWhere an admit's time goes (each part called 1,000 times in one server-side loop, µs per call):\n\n| part | µs |\n|---|--:|\n");
    for (part, us) in parts {
        md.push_str(&format!("| `{part}` | {us:.1} |\n"));
    }
    md.push_str("\nWhat each side asks of the server, per transaction (2,000 in one server-side loop, commits not waiting for the disk, least of 6 rounds, µs):\n\n| side | µs | above unfenced |\n|---|--:|--:|\n");
    let unfenced = costs[Side::Unfenced as usize].1;
    for (side, us) in costs {
        md.push_str(&format!(
            "| {} | {us:.1} | {:.1} |\n",
            side.name(),
            us - unfenced
        ));
    }
    md.push_str(&format!(
        "\nAdmit committed alone, 1 in flight: the current token (check) p50 {:.3} ms, p99 {:.3} ms; a higher one (the raise, once per new holder) p50 {:.3} ms, p99 {:.3} ms.\n",
        ms(check.p50),
        ms(check.p99),
        ms(raise.p50),
        ms(raise.p99)
    ));
    md
}
