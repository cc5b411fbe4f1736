/**
 * The lease guard against a real etcd and lease-proxy: renewal, release, waiting, idempotent
 * retry, `using`, sessions, the event stream, and each way a loss reaches the work: the proxy's
 * event (a takeover), a refused renewal (410), the stop-by deadline (renewals stopped, the proxy
 * killed).
 */

import assert from "node:assert/strict";
import { before, describe, test } from "node:test";

import { Client, HeldError, LostError, type Lease } from "../src/index.js";
import { relay, sleep, startEtcd, startProxy, takeOver, unique, type Etcd, type Proxy } from "./harness.js";

let etcd: Etcd;
let proxy: Proxy;
let client: Client;

before(async () => {
  etcd = await startEtcd();
  proxy = await startProxy(etcd);
  client = new Client(proxy.url);
});

/** Waits for the lease's loss at most `withinMs`; how long it took. */
async function lostWithin(lease: Lease, withinMs: number): Promise<[LostError, number]> {
  const t0 = performance.now();
  const timeout = sleep(withinMs).then(() => undefined);
  const lost = await Promise.race([lease.lost, timeout]);
  assert.ok(lost instanceof LostError, `not lost within ${withinMs} ms`);
  assert.equal(lease.signal.reason, lost);
  return [lost, performance.now() - t0];
}

describe("holding", () => {
  test("a lease is renewed past its TTL and released", async () => {
    const resource = unique();
    const lease = await client.acquire(resource, { holder: "a", ttlSeconds: 2 });
    const first = lease.stopBy;
    await sleep(2600);
    assert.equal(lease.isLost(), false);
    assert.ok(lease.stopBy > first + 1000, "renewals moved the deadline on");
    assert.equal((await client.get(resource))?.token, lease.token);
    await lease.release();
    assert.equal(lease.lostReason?.reason, "released");
    assert.equal(await client.get(resource), undefined);
    await lease.release(); // idempotent
  });

  test("`await using` releases the lease and the session at the end of the block", async () => {
    const [resource, other] = [unique(), unique()];
    let held: Lease;
    {
      await using lease = await client.acquire(resource, { holder: "a", ttlSeconds: 5 });
      await using session = await client.openSession({ holder: "a", ttlSeconds: 5 });
      await session.acquire(other);
      held = lease;
      assert.equal((await client.get(other))?.holder, "a");
    }
    assert.equal(held.lostReason?.reason, "released");
    assert.equal(await client.get(resource), undefined);
    assert.equal(await client.get(other), undefined);
  });

  test("a held resource is a HeldError, and a waiting acquire gets it once released", async () => {
    const resource = unique();
    const lease = await client.acquire(resource, { holder: "first", ttlSeconds: 5 });
    await assert.rejects(client.acquire(resource, { holder: "second", ttlSeconds: 5 }), (e: unknown) => {
      assert.ok(e instanceof HeldError);
      assert.equal(e.holder, "first");
      assert.equal(e.token, lease.token);
      return true;
    });
    const waiting = client.acquire(resource, { holder: "second", ttlSeconds: 5, waitMs: 5000 });
    await sleep(200);
    await lease.release();
    const second = await waiting;
    assert.ok(second.token > lease.token);
    await second.release();
  });

  test("an acquire whose answer is lost is retried with its idempotency key: the same grant", async () => {
    const resource = unique();
    const lossy = await relay(Number(new URL(proxy.url).port), true);
    try {
      const lease = await new Client(lossy.url).acquire(resource, {
        holder: "a",
        ttlSeconds: 5,
        idempotencyKey: unique("key"),
      });
      assert.equal(lossy.connections, 2);
      const held = await client.get(resource);
      assert.equal(held?.token, lease.token);
      await lease.release();
      assert.equal(await client.get(resource), undefined, "no orphan grant left");
    } finally {
      lossy.close();
    }
  });

  test("close() releases every lease and session the client holds", async () => {
    const own = new Client(proxy.url, { holder: "closer" });
    const [a, b] = [unique(), unique()];
    const lease = await own.acquire(a, { ttlSeconds: 5 });
    const session = await own.openSession({ ttlSeconds: 5 });
    await session.acquire(b);
    await own.close();
    assert.equal(lease.lostReason?.reason, "released");
    assert.equal(session.isLost(), true);
    assert.equal(await client.get(a), undefined);
    assert.equal(await client.get(b), undefined);
  });

  test("using() releases after the work and gives its result", async () => {
    const resource = unique();
    const holder = await client.using(resource, { holder: "u", ttlSeconds: 3 }, async (lease, signal) => {
      assert.equal(signal.aborted, false);
      return (await client.get(lease.resource))?.holder;
    });
    assert.equal(holder, "u");
    assert.equal(await client.get(resource), undefined);
  });
});

describe("loss", () => {
  test("a takeover reaches the work at once through the proxy's event stream", async () => {
    const resource = unique();
    let leaseId = "";
    const t0 = performance.now();
    const outcome = client.using(resource, { holder: "worker", ttlSeconds: 10 }, async (lease, signal) => {
      leaseId = lease.leaseId;
      await new Promise((_, reject) => signal.addEventListener("abort", () => reject(signal.reason)));
    });
    await sleep(300);
    await etcd.revoke(leaseId);
    await assert.rejects(outcome, (e: unknown) => e instanceof LostError && e.reason === "revoked" && /event stream/.test(e.message));
    assert.ok(performance.now() - t0 < 2000, "well before the 10 s TTL");
  });

  test("an acquire by another holder after the loss is reported with its token", async () => {
    const resource = unique();
    const lease = await client.acquire(resource, { holder: "old", ttlSeconds: 10 });
    await etcd.revoke(lease.leaseId);
    const grant = await takeOver(proxy.url, resource, "new", 10, 5000);
    const [lost] = await lostWithin(lease, 2000);
    assert.equal(lost.reason, "revoked");
    assert.ok(BigInt(grant.token) > lease.token);
  });

  test("without the event stream, a refused renewal (410) loses the lease", async () => {
    const plain = new Client(proxy.url, { watchLoss: false });
    const lease = await plain.acquire(unique(), { holder: "a", ttlSeconds: 3 });
    await etcd.revoke(lease.leaseId);
    const [lost, took] = await lostWithin(lease, 2500);
    assert.equal(lost.reason, "revoked");
    assert.match(lost.message, /renewal was refused/);
    assert.ok(took < 2500);
  });

  test("renewals stopped: the stop-by deadline aborts the work before anyone else can hold it", async () => {
    const resource = unique();
    const plain = new Client(proxy.url, { watchLoss: false });
    const lease = await plain.acquire(resource, { holder: "paused", ttlSeconds: 2 });
    lease.pauseRenewals(true);
    const grant = await takeOver(proxy.url, resource, "usurper", 5, 8000);
    assert.equal(lease.isLost(), true, "lost no later than the takeover");
    assert.equal(lease.lostReason?.reason, "expired");
    assert.ok(BigInt(grant.token) > lease.token);
  });

  test("the proxy killed: no answer, no event, and the stop-by deadline still aborts the work", async () => {
    const doomed = await startProxy(etcd);
    const lonely = new Client(doomed.url, { timeoutMs: 500 });
    const lease = await lonely.acquire(unique(), { holder: "a", ttlSeconds: 2 });
    const stopBy = lease.stopBy;
    doomed.process.kill("SIGKILL");
    const [lost] = await lostWithin(lease, 3000);
    assert.equal(lost.reason, "expired");
    const late = performance.now() - stopBy;
    assert.ok(late >= 0 && late < 300, `aborted ${late.toFixed(0)} ms after the stop-by deadline`);
  });
});

describe("sessions and events", () => {
  test("a session holds many resources; its loss reaches every lease under it", async () => {
    const session = await client.openSession({ holder: "s", ttlSeconds: 5 });
    const a = await session.acquire(unique());
    const b = await session.acquire(unique(), { holder: "s/arm" });
    assert.equal(a.leaseId, session.id);
    await etcd.revoke(session.id);
    const [lost] = await lostWithin(b, 3000);
    assert.ok(lost.reason === "revoked" || lost.reason === "session-lost");
    assert.equal(a.isLost(), true);
    await session.close();
  });

  test("the event stream shows grants made and ended, and resumes after an id", async () => {
    const resource = unique("ev");
    // A stream without a last id starts where its connection lands, which may be after the
    // acquire below: this one starts after a revision read first.
    const mark = await client.acquire(`mark-${resource}`, { holder: "w", ttlSeconds: 5 });
    await mark.release();
    const events = client.watch({ prefix: resource, lastEventId: String(mark.token) });
    const first = events.next();
    const lease = await client.acquire(resource, { holder: "w", ttlSeconds: 5 });
    await lease.release();
    const acquired = (await first).value;
    assert.equal(acquired.type, "acquired");
    assert.equal(acquired.token, lease.token);
    const released = (await events.next()).value;
    assert.deepEqual([released.type, released.token], ["released", lease.token]);
    await events.return();
    const again = client.watch({ prefix: resource, lastEventId: acquired.id });
    assert.equal((await again.next()).value.id, released.id);
    await again.return();
  });
});
