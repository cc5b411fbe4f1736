/**
 * Tokens reaching the storage: `lease.fetch` through fence-gateway in front of the warehouse
 * inventory (the old holder's write refused once a newer holder wrote), the robot example
 * against that stack (SIGSTOPped past its TTL it writes nothing more), and `admit` inside a
 * node-postgres transaction against the in-database package on a scratch database.
 */

import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import { createInterface } from "node:readline";
import { after, before, describe, test } from "node:test";
import { fileURLToPath } from "node:url";

import pg from "pg";

import { Client, LostError, admit, fencedTransaction } from "../src/index.js";
import { binary, keyFile, sleep, startEtcd, startProxy, startWarehouse, takeOver, unique, type Etcd } from "./harness.js";

let etcd: Etcd;
let gateway: string;
let inventory: string;
/** Pre-fences the gateway at every grant. */
let proxy: string;
/** Does not: the gateway learns of a new holder from its first write. */
let lazyProxy: string;

before(async () => {
  etcd = await startEtcd();
  ({ inventory, gateway } = await startWarehouse());
  proxy = (await startProxy(etcd, ["--upstream", gateway, "--prefence-url", gateway])).url;
  lazyProxy = (await startProxy(etcd, ["--upstream", gateway])).url;
});

interface Applied {
  aisle: string;
  robot: string;
  revision: number;
}

async function writesBy(robot: string): Promise<Applied[]> {
  return ((await (await fetch(`${inventory}/log`)).json()) as Applied[]).filter((w) => w.robot === robot);
}

function count(robot: string, n: number): RequestInit {
  return { method: "PUT", headers: { "content-type": "application/json" }, body: JSON.stringify({ robot, count: n }) };
}

describe("through fence-gateway", () => {
  test("the old holder's token is refused at the gateway once a newer holder wrote", async () => {
    const aisle = unique("aisle");
    const oldClient = new Client(lazyProxy, { watchLoss: false }); // learns of its loss late
    const old = await oldClient.acquire(aisle, { holder: "old", ttlSeconds: 10 });
    assert.equal((await old.fetch(`${gateway}/aisles/${aisle}/count`, count("old", 1))).status, 200);
    await etcd.revoke(old.leaseId);
    const newer = await new Client(lazyProxy).acquire(aisle, { holder: "new", ttlSeconds: 10 });
    assert.equal((await newer.fetch(`${gateway}/aisles/${aisle}/count`, count("new", 2))).status, 200);
    assert.equal(old.isLost(), false, "the old holder has not noticed yet");
    const refused = await old.fetch(`${gateway}/aisles/${aisle}/count`, count("old", 3));
    assert.equal(refused.status, 409);
    assert.equal(refused.headers.get("fencing-rejection"), "stale-fencing-token");
    assert.deepEqual((await writesBy("old")).map((w) => w.revision), [Number(old.token)]);
    await newer.release();
    await old.release().catch(() => {});
  });

  test("a lost lease sends nothing: lease.fetch throws its LostError", async () => {
    const aisle = unique("aisle");
    const lease = await new Client(proxy).acquire(aisle, { holder: "gone", ttlSeconds: 10 });
    await etcd.revoke(lease.leaseId);
    await takeOver(proxy, aisle, "usurper", 10, 5000);
    await lease.lost;
    await assert.rejects(lease.fetch(`${gateway}/aisles/${aisle}/count`, count("gone", 1)), LostError);
    assert.deepEqual(await writesBy("gone"), []);
  });
});

describe("the robot example", () => {
  const robot = fileURLToPath(new URL("../examples/robot.js", import.meta.url));

  function run(...args: string[]) {
    const child = spawn(process.execPath, [robot, "--proxy", proxy, "--gateway", gateway, ...args], { stdio: ["ignore", "pipe", "inherit"] });
    const seen: string[] = [];
    const waiters: [string, (line: string) => void][] = [];
    createInterface({ input: child.stdout }).on("line", (line) => {
      seen.push(line);
      const i = waiters.findIndex(([prefix]) => line.startsWith(prefix));
      if (i >= 0) waiters.splice(i, 1)[0][1](line);
    });
    const exited = new Promise<number | null>((resolve) => child.on("exit", resolve));
    after(() => void child.kill("SIGKILL"));
    const expect = (prefix: string) =>
      new Promise<string>((resolve, reject) => {
        const old = seen.find((l) => l.startsWith(prefix) && !consumed.has(l));
        if (old) return consumed.add(old), resolve(old);
        const timer = setTimeout(() => reject(new Error(`no ${prefix}; saw ${seen.join(" | ")}`)), 20_000);
        waiters.push([prefix, (l) => (clearTimeout(timer), consumed.add(l), resolve(l))]);
      });
    const consumed = new Set<string>();
    return { child, seen, exited, expect };
  }

  test("counts aisles through the gateway with its token, and releases them", async () => {
    const name = unique("robot");
    const r = run("--aisles", `${name}-a,${name}-b`, "--name", name, "--ttl", "2", "--rounds", "2", "--updates", "2", "--count-ms", "50");
    assert.equal(await r.exited, 0, r.seen.join("\n"));
    const acquired = r.seen.filter((l) => l.startsWith("event acquired")).map((l) => l.split(" "));
    assert.equal(acquired.length, 2);
    assert.equal(r.seen.filter((l) => l.startsWith("event write-ok")).length, 4);
    const writes = await writesBy(name);
    assert.deepEqual(writes.map((w) => [w.aisle, w.revision]), acquired.flatMap((a) => [[a[2], Number(a[3])], [a[2], Number(a[3])]]));
  });

  test("stopped past its TTL, it learns of the loss before writing again", async () => {
    const name = unique("robot");
    const r = run("--aisles", name, "--name", name, "--ttl", "2", "--rounds", "1", "--updates", "40", "--count-ms", "200");
    const token = BigInt((await r.expect("event acquired")).split(" ")[3]);
    await r.expect("event write-ok");
    r.child.kill("SIGSTOP");
    let before: number;
    try {
      await sleep(300); // a write in flight when it stopped lands now
      before = (await writesBy(name)).length;
      const grant = await takeOver(proxy, name, "usurper", 10, 20_000);
      assert.ok(BigInt(grant.token) > token);
    } finally {
      r.child.kill("SIGCONT");
    }
    const lost = await r.expect("event lost");
    assert.ok(["expired", "revoked"].includes(lost.split(" ")[3]), lost);
    assert.equal(await r.exited, 0);
    const after = r.seen.slice(r.seen.indexOf(lost));
    assert.ok(!after.some((l) => l.startsWith("event write-ok")), r.seen.join("\n"));
    assert.equal((await writesBy(name)).length, before);
  });

  test("robots in a fleet share its aisles and hand them over", async () => {
    const name = unique("fleet");
    const aisles = [`${name}-1`, `${name}-2`];
    // A long drain deadline: the hand-offs below are the robots' own releases.
    await new Client(proxy).putFleet(name, { resources: aisles, drainMs: 20_000 });
    const robot = (n: string) => run("--fleet", name, "--name", `${name}-${n}`, "--ttl", "5", "--count-ms", "50");
    const first = robot("a");
    await first.expect("event acquired");
    await first.expect("event acquired");
    await first.expect("event write-ok");
    const second = robot("b");
    const moved = (await first.expect("event lost")).split(" ");
    assert.equal(moved[3], "handed-off");
    assert.equal((await second.expect("event acquired")).split(" ")[2], moved[2]);
    await second.expect(`event write-ok ${moved[2]}`);
    // Interrupted, the first robot leaves: its other aisle goes to the second.
    first.child.kill("SIGINT");
    assert.equal(await first.exited, 0, first.seen.join("\n"));
    const rest = (await second.expect("event acquired")).split(" ")[2];
    await second.expect(`event write-ok ${rest}`);
    second.child.kill("SIGINT");
    assert.equal(await second.exited, 0, second.seen.join("\n"));
    // Each aisle: the first robot's writes, then the second's, under ever larger tokens.
    const log = ((await (await fetch(`${inventory}/log`)).json()) as Applied[]).filter((w) => aisles.includes(w.aisle));
    for (const aisle of aisles) {
      const writes = log.filter((w) => w.aisle === aisle);
      const revisions = writes.map((w) => w.revision);
      assert.deepEqual(revisions, [...revisions].sort((x, y) => x - y), `${aisle}: tokens in order`);
      assert.equal(writes[0]?.robot, `${name}-a`);
      assert.equal(writes.at(-1)?.robot, `${name}-b`);
    }
  });
});

describe("inside PostgreSQL", () => {
  const admin = process.env.FENCING_TEST_POSTGRES ?? "postgres://lease_proxy:lease_proxy@127.0.0.1:5432/lease_proxy_test";
  const name = `ts_${unique("db").replace(/-/g, "_")}`;
  const parts = new URL(admin);
  const url = (user: string) => `postgres://${user}:${parts.password}@${parts.host}/${name}`;
  let pool: pg.Pool;

  before(async () => {
    const db = new pg.Client({ connectionString: admin });
    await db.connect();
    try {
      await db.query(`CREATE DATABASE ${name}`);
      await db.query(`CREATE ROLE ${name}_owner NOLOGIN`);
      await db.query(`GRANT ${name}_owner TO CURRENT_USER`);
      await db.query(`CREATE ROLE ${name}_app LOGIN PASSWORD '${parts.password}'`);
    } finally {
      await db.end();
    }
    const installer = url(parts.username);
    for (const args of [
      ["install", "--database-url", installer, "--owner", `${name}_owner`, "--writer", `${name}_app`],
      ["sync-keys", "--database-url", installer, "--key-file", keyFile],
    ]) {
      const done = spawnSync(binary("FENCE_GATEWAY_BIN", "fence-gateway"), ["pg", ...args], { encoding: "utf8", timeout: 60_000 });
      assert.equal(done.status, 0, done.stdout + done.stderr);
    }
    const setup = new pg.Client({ connectionString: installer });
    await setup.connect();
    await setup.query("CREATE TABLE counts (aisle text, robot text, n int)");
    await setup.query(`GRANT SELECT, INSERT ON counts TO ${name}_app`);
    await setup.end();
    pool = new pg.Pool({ connectionString: url(`${name}_app`), max: 4 });
  });

  after(async () => {
    await pool?.end();
    const db = new pg.Client({ connectionString: admin });
    await db.connect();
    await db.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
    await db.query(`DROP ROLE IF EXISTS ${name}_app`);
    await db.query(`DROP ROLE IF EXISTS ${name}_owner`);
    await db.end();
  });

  test("admit in the caller's transaction: the old holder is refused (23F01) once a newer one wrote", async () => {
    const aisle = unique("aisle");
    const client = new Client(lazyProxy, { watchLoss: false });
    const old = await client.acquire(aisle, { holder: "old", ttlSeconds: 10 });
    const insert = (robot: string) => async (db: { query(t: string, v?: unknown[]): Promise<unknown> }) =>
      db.query("INSERT INTO counts VALUES ($1, $2, 1)", [aisle, robot]);
    await fencedTransaction(pool, old, insert("old"));
    await etcd.revoke(old.leaseId);
    const newer = await new Client(lazyProxy).acquire(aisle, { holder: "new", ttlSeconds: 10 });
    const db = await pool.connect();
    try {
      await db.query("BEGIN");
      assert.equal(await admit(db, newer), `0:${newer.token}`);
      await insert("new")(db);
      await db.query("COMMIT");
    } finally {
      db.release();
    }
    assert.equal(old.isLost(), false, "the old holder has not noticed yet");
    await assert.rejects(fencedTransaction(pool, old, insert("old")), (e: unknown) => (e as { code?: string }).code === "23F01");
    const { rows } = await pool.query("SELECT robot FROM counts WHERE aisle = $1 ORDER BY robot", [aisle]);
    assert.deepEqual(rows.map((r) => r.robot), ["new", "old"]);
    await newer.release();
  });
});
