/**
 * Fleets. Against the real proxy: a member receives its resources and writes through
 * fence-gateway with their tokens; a second member joining takes some — the first member's
 * work on each is aborted (`handed-off`) and the resource released well within the drain
 * deadline, the new member writes, the old member's late write is refused —; a drain hands off
 * the rest; an evicted member ends; a member whose session ends is told — or, with `rejoin`,
 * joins again and gets back what it held —; a join under a live member's name replaces it and
 * gets back what it held; the operator's calls
 * (a fleet read back, a drain without a secret, no such member, evict, delete); a proxy whose
 * `--max-wait` is shorter than the poll. Against a scripted proxy following the contract
 * (DESIGN §5.5): how assignments become leases, a grant delivered once, no release over a
 * successor grant, a malformed assignment, an older assignment answered after a newer one.
 */

import assert from "node:assert/strict";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { after, before, describe, test } from "node:test";

import { Client, LostError, ProblemError, type Lease } from "../src/index.js";
import { eventually, startEtcd, startProxy, startWarehouse, unique, type Etcd } from "./harness.js";

let etcd: Etcd;
let proxy: string;
let gateway: string;
let inventory: string;

before(async () => {
  etcd = await startEtcd();
  ({ gateway, inventory } = await startWarehouse());
  proxy = (await startProxy(etcd, ["--upstream", gateway, "--prefence-url", gateway])).url;
});

/** Values pushed by the work of members, taken by the test in arrival order. */
class Mailbox<T> {
  private readonly items: T[] = [];
  private wake: (() => void) | undefined;

  push(item: T): void {
    this.items.push(item);
    this.wake?.();
  }

  /** The next `n` items within `withinMs`. */
  async take(n: number, withinMs: number, what: string): Promise<T[]> {
    const deadline = performance.now() + withinMs;
    while (this.items.length < n) {
      const left = deadline - performance.now();
      if (left <= 0) throw new Error(`${what}: ${this.items.length} of ${n} within ${withinMs} ms`);
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, left);
        this.wake = () => {
          clearTimeout(timer);
          resolve();
        };
      });
      this.wake = undefined;
    }
    return this.items.splice(0, n);
  }
}

interface Ended {
  lease: Lease;
  reason: unknown;
}

/** Work for `member.run` that reports its start and end and waits for its signal. */
function worker() {
  const started = new Mailbox<Lease>();
  const ended = new Mailbox<Ended>();
  const work = async (lease: Lease, signal: AbortSignal) => {
    started.push(lease);
    if (!signal.aborted) await new Promise((resolve) => signal.addEventListener("abort", resolve, { once: true }));
    ended.push({ lease, reason: signal.reason });
  };
  return { started, ended, work };
}

const byResource = <T extends { resource: string }>(xs: T[]) => [...xs].sort((a, b) => a.resource.localeCompare(b.resource));
const reasonOf = (e: unknown) => (e instanceof LostError ? e.reason : String(e));

const put = (lease: { fetch: typeof fetch }, aisle: string, robot: string) =>
  lease.fetch(`${gateway}/aisles/${aisle}/count`, { method: "PUT", body: JSON.stringify({ robot, count: 1 }) });

async function writesTo(aisle: string): Promise<string[]> {
  const log = (await (await fetch(`${inventory}/log`)).json()) as { aisle: string; robot: string; revision: number }[];
  return log.filter((w) => w.aisle === aisle).map((w) => `${w.robot}@${w.revision}`);
}

describe("against the proxy", () => {
  test("a member receives, writes, hands off within the deadline and drains; one whose session ends is told", async () => {
    const admin = new Client(proxy);
    const fleet = unique("aisles");
    const aisles = [1, 2, 3, 4].map((n) => `${fleet}-${n}`);
    // A long drain deadline: a hand-off done within a few seconds was the member's own
    // release, not the service's revocation.
    const drainMs = 20_000;
    await admin.putFleet(fleet, { resources: aisles, drainMs });

    const w1 = worker();
    const m1 = await new Client(proxy).joinFleet(fleet, { member: "m1", ttlSeconds: 10, pollWaitMs: 2000 });
    const run1 = m1.run(w1.work);
    const first = byResource(await w1.started.take(4, 5000, "m1's assignments"));
    assert.deepEqual(first.map((l) => l.resource), aisles);
    for (const lease of first) {
      assert.equal(lease.leaseId, m1.session.id, "a fleet grant lives on the member's session");
      assert.equal((await put(lease, lease.resource, "m1")).status, 200);
    }

    const w2 = worker();
    const m2 = await new Client(proxy).joinFleet(fleet, { member: "m2", ttlSeconds: 10, pollWaitMs: 2000 });
    const joined = performance.now();
    const run2 = m2.run(w2.work);
    const moved = (await w1.ended.take(2, 5000, "m1's work on the moved resources aborted")).sort((a, b) =>
      a.lease.resource.localeCompare(b.lease.resource),
    );
    const taken = byResource(await w2.started.take(2, 5000, "m2's assignments"));
    const took = performance.now() - joined;
    assert.ok(took < drainMs / 4, `the hand-off took ${took} ms: the service's revocation, not the member's release`);
    for (const [i, { lease: old, reason }] of moved.entries()) {
      assert.equal(reasonOf(reason), "handed-off");
      // To be released within the drain deadline (on the proxy's clock), less a tenth.
      const by = old.releaseBy;
      assert.ok(by !== undefined && by >= joined + drainMs / 2 && by <= performance.now() + drainMs * 0.9, `releaseBy ${by}`);
      const lease = taken[i];
      assert.equal(lease.resource, old.resource);
      assert.ok(lease.token > old.token);
      assert.equal((await put(lease, lease.resource, "m2")).status, 200);
      // The old member's late write: its lease sends nothing once handed off; its token,
      // presented anyway, is refused by the gateway.
      await assert.rejects(put(old, old.resource, "m1"), (e) => e instanceof LostError && e.reason === "handed-off");
      const stale = await fetch(`${gateway}/aisles/${old.resource}/count`, {
        method: "PUT",
        headers: { "fencing-token": old.fencingToken, "fencing-resource": old.resource },
        body: JSON.stringify({ robot: "m1", count: 2 }),
      });
      assert.equal(stale.status, 409);
      assert.equal(stale.headers.get("fencing-rejection"), "stale-fencing-token");
      assert.deepEqual(await writesTo(old.resource), [`m1@${old.token}`, `m2@${lease.token}`]);
    }

    await m1.drain();
    const drained = await w1.ended.take(2, 5000, "m1's remaining work aborted by the drain");
    const rest = byResource(await w2.started.take(2, 5000, "the drained resources reaching m2"));
    assert.deepEqual(drained.map((d) => reasonOf(d.reason)), ["handed-off", "handed-off"]);
    assert.deepEqual(rest.map((l) => l.resource), byResource(drained.map((d) => d.lease)).map((l) => l.resource));
    assert.equal(m1.signal.aborted, false, "a drained member is still a member");
    const view = await admin.getFleet(fleet);
    assert.deepEqual(
      view?.members.map((m) => [m.member, m.state, m.held.length]),
      [["m1", "draining", 0], ["m2", "active", 4]],
    );
    // Evicted by an operator: the member is told and ends.
    await admin.evictMember(fleet, "m1");
    await run1;
    assert.match(String((m1.signal.reason as LostError).message), /evicted/);

    // m2's session ends under it (its etcd lease revoked): the member is told.
    await etcd.revoke(m2.session.id);
    const ended = await w2.ended.take(4, 3000, "m2's work aborted when its session ended");
    for (const e of ended) assert.ok(e.reason instanceof LostError, `ended with ${String(e.reason)}`);
    await run2;
    assert.equal(m2.signal.aborted, true);
    assert.ok(m2.signal.reason instanceof LostError);
    await admin.deleteFleet(fleet);
  });

  test("the operator's calls: read back, drain without a secret, no such member, evict, delete", async () => {
    const admin = new Client(proxy);
    const fleet = unique("operator");
    assert.equal(await admin.getFleet(fleet), undefined);
    const aisles = [`${fleet}-1`, `${fleet}-2`];
    await admin.putFleet(fleet, { resources: aisles, drainMs: 7000, maxMoves: 3 });
    const view = await admin.getFleet(fleet);
    assert.ok(view);
    const { revision, ...rest } = view;
    assert.ok(revision > 0n);
    assert.deepEqual(rest, { fleet, resources: aisles, drainMs: 7000, maxMoves: 3, members: [], unassigned: aisles });

    const join = async (member: string) => {
      const m = await new Client(proxy).joinFleet(fleet, { member, ttlSeconds: 10, pollWaitMs: 2000 });
      const w = worker();
      return { m, w, running: m.run(w.work) };
    };
    const one = await join("m1");
    await one.w.started.take(2, 5000, "m1's assignments");
    const two = await join("m2");
    await one.w.ended.take(1, 5000, "m1's work on the resource moved to m2");
    await two.w.started.take(1, 5000, "m2's share");

    const noSuch = (e: unknown) => e instanceof ProblemError && e.status === 404;
    await assert.rejects(admin.drainMember(fleet, "nobody"), noSuch);
    await assert.rejects(admin.evictMember(fleet, "nobody"), noSuch);
    await assert.rejects(admin.drainMember(`${fleet}-none`, "m1"), noSuch);

    // Drained by an operator, without the member's secret: its work is handed off to m2 (a
    // draining member with nobody to hand off to keeps what it holds).
    await admin.drainMember(fleet, "m1");
    const [drained] = await one.w.ended.take(1, 5000, "m1's work handed off by the operator's drain");
    assert.equal(reasonOf(drained.reason), "handed-off");
    const [moved] = await two.w.started.take(1, 5000, "the drained resource reaching m2");
    assert.equal(moved.resource, drained.lease.resource);
    assert.equal(one.m.signal.aborted, false, "a drained member is still a member");
    const after = await admin.getFleet(fleet);
    assert.deepEqual(after?.members.map((m) => [m.member, m.state, m.held.length]), [["m1", "draining", 0], ["m2", "active", 2]]);
    assert.deepEqual(after?.unassigned, []);

    await admin.evictMember(fleet, "m1");
    await one.running;
    assert.match(String((one.m.signal.reason as LostError).message), /evicted/);
    await two.m.leave();
    await two.running;
    await admin.deleteFleet(fleet);
    await admin.deleteFleet(fleet);
    assert.equal(await admin.getFleet(fleet), undefined);
  });

  test("a member joining again under its name replaces the old one and gets back what it held", async () => {
    // Static membership: the old session is closed, and what it held goes to the new one first.
    const fleet = unique("rejoin");
    const aisles = [`${fleet}-1`, `${fleet}-2`];
    await new Client(proxy).putFleet(fleet, { resources: aisles });
    const join = async () => {
      const m = await new Client(proxy).joinFleet(fleet, { member: "m1", ttlSeconds: 10, pollWaitMs: 2000 });
      const w = worker();
      return { m, w, running: m.run(w.work) };
    };
    const old = await join();
    const before = byResource(await old.w.started.take(2, 5000, "the first member's assignments"));
    const again = await join();
    const ended = await old.w.ended.take(2, 5000, "the replaced member's work aborted");
    for (const e of ended) assert.ok(e.reason instanceof LostError, `ended with ${String(e.reason)}`);
    await old.running;
    assert.ok(old.m.signal.reason instanceof LostError);
    const after = byResource(await again.w.started.take(2, 5000, "the new member's assignments"));
    assert.notEqual(again.m.session.id, old.m.session.id);
    for (const [i, lease] of after.entries()) {
      assert.equal(lease.resource, before[i].resource);
      assert.ok(lease.token > before[i].token);
      assert.equal(lease.leaseId, again.m.session.id);
    }
    await again.m.leave();
    await again.running;
  });

  test("with rejoin, a member whose session ends joins again and gets back what it held", async () => {
    // Twice: its etcd lease revoked (the member record gone with it), then its session calls
    // cut (keepalives, and the close sent when the client gives the session up) until the client
    // gives the session up while the service still has it — within the TTL the rejoin replaces
    // the live member, and what it held comes back to it, not to the other member.
    const fleet = unique("rejoining");
    const aisles = [1, 2, 3, 4].map((n) => `${fleet}-${n}`);
    await new Client(proxy).putFleet(fleet, { resources: aisles, drainMs: 2000 });
    let cut = false;
    const cuttable: typeof fetch = (input, init) =>
      cut && new URL(String(input instanceof Request ? input.url : input)).pathname.startsWith("/v1/sessions/")
        ? Promise.reject(new TypeError("session calls cut"))
        : fetch(input, init);
    const m1 = await new Client(proxy, { fetch: cuttable, safetyMarginMs: 2000 }).joinFleet(fleet, {
      member: "m1",
      ttlSeconds: 6,
      pollWaitMs: 2000,
      rejoin: true,
    });
    const changes: boolean[] = [];
    const w1 = worker();
    const run1 = (async () => {
      const running: Promise<void>[] = [];
      for await (const change of m1.assignments()) {
        changes.push(change.rejoined);
        for (const lease of change.added) running.push(w1.work(lease, lease.signal).then(() => lease.release().catch(() => {})));
      }
      await Promise.all(running);
    })();
    const before = byResource(await w1.started.take(4, 5000, "m1's assignments"));
    const first = m1.session.id;

    // Its etcd lease revoked: every lease lost, a new session, granted again.
    await etcd.revoke(first);
    for (const e of await w1.ended.take(4, 5000, "m1's work aborted when its session ended")) {
      assert.ok(e.reason instanceof LostError, `ended with ${String(e.reason)}`);
    }
    const again = byResource(await w1.started.take(4, 5000, "m1's assignments after joining again"));
    const second = m1.session.id;
    assert.notEqual(second, first);
    assert.equal(m1.rejoins, 1);
    assert.equal(m1.signal.aborted, false, "a member that joined again is still a member");
    assert.ok(changes.includes(true), "a change says rejoined");
    for (const [i, lease] of again.entries()) {
      assert.equal(lease.resource, before[i].resource);
      assert.ok(lease.token > before[i].token);
      assert.equal(lease.leaseId, second);
      assert.equal((await put(lease, lease.resource, "m1")).status, 200);
      const stale = await fetch(`${gateway}/aisles/${lease.resource}/count`, {
        method: "PUT",
        headers: { "fencing-token": before[i].fencingToken, "fencing-resource": lease.resource },
        body: JSON.stringify({ robot: "m1", count: 2 }),
      });
      assert.equal(stale.status, 409, "the lost session's token is refused");
    }

    // A second member takes half; then m1's session calls are cut.
    const w2 = worker();
    const m2 = await new Client(proxy).joinFleet(fleet, { member: "m2", ttlSeconds: 10, pollWaitMs: 2000 });
    const run2 = m2.run(w2.work);
    await w1.ended.take(2, 5000, "m1's work on the resources moved to m2");
    const theirs = (await w2.started.take(2, 5000, "m2's assignments")).map((l) => l.resource);
    const kept = again.filter((l) => !theirs.includes(l.resource));
    cut = true;
    const cutAt = performance.now();
    for (const e of await w1.ended.take(2, 10_000, "m1's work aborted when it gave its session up")) {
      assert.ok(e.reason instanceof LostError, `ended with ${String(e.reason)}`);
    }
    cut = false;
    const back = byResource(await w1.started.take(2, 5000, "what m1 held, granted to its new session"));
    const took = performance.now() - cutAt;
    assert.ok(took < 6000, `m1 got its resources back ${took} ms after the cut: past the TTL`);
    const third = m1.session.id;
    assert.notEqual(third, second);
    assert.equal(m1.rejoins, 2);
    for (const [i, lease] of back.entries()) {
      assert.equal(lease.resource, kept[i].resource);
      assert.ok(lease.token > kept[i].token);
      assert.equal(lease.leaseId, third);
    }
    // m2 kept its own throughout: static membership gave m1's to nobody else.
    await assert.rejects(w2.ended.take(1, 100, "m2's work"), /0 of 1/);
    assert.equal(m2.signal.aborted, false);

    // Leave ends it for good: no rejoin after that.
    await m1.leave();
    await run1;
    assert.equal(m1.signal.aborted, true);
    assert.equal(m1.rejoins, 2);
    await m2.leave();
    await run2;
  });

  test("a member polls within the proxy's --max-wait", async () => {
    // A proxy that lets a request wait 1 s at most refuses the member's 10 s poll (400
    // invalid-field): the member polls within that instead of ending.
    const short = await startProxy(etcd, ["--max-wait", "1s"]);
    const client = new Client(short.url);
    const fleet = unique("short-wait");
    await client.putFleet(fleet, { resources: [`${fleet}-1`] });
    const member = await client.joinFleet(fleet, { member: "m", ttlSeconds: 10 });
    const w = worker();
    const running = member.run(w.work);
    assert.deepEqual((await w.started.take(1, 3000, "the first assignment")).map((l) => l.resource), [`${fleet}-1`]);
    await client.putFleet(fleet, { resources: [`${fleet}-1`, `${fleet}-2`] });
    assert.deepEqual((await w.started.take(1, 3000, "the resource added later")).map((l) => l.resource), [`${fleet}-2`]);
    assert.equal(member.signal.aborted, false);
    await member.leave();
    await running;
    short.process.kill("SIGKILL");
  });
});

describe("against the contract", () => {
  /** A proxy that answers joins, keepalives, releases and scripted assignments. */
  const views: object[] = [];
  const released: string[] = [];
  const server = createServer((req, res) => {
    const path = req.url ?? "";
    const reply = (status: number, body?: object) =>
      void res.writeHead(status, { "content-type": "application/json" }).end(body ? JSON.stringify(body) : undefined);
    if (req.method === "POST" && path === "/v1/fleets/f/members") {
      return reply(201, { fleet: "f", member: "m", session_id: "9", secret: "sec", ttl_seconds: 30, expires_in_ms: 30000 });
    }
    if (path.startsWith("/v1/sessions/9")) return reply(req.method === "DELETE" ? 204 : 200, { session_id: "9", ttl_seconds: 30, expires_in_ms: 30000 });
    if (req.method === "DELETE" && path.startsWith("/v1/leases/")) {
      assert.equal(req.headers["lease-secret"], "sec", "a fleet grant is released with the session's secret");
      released.push(path.slice("/v1/leases/".length));
      return reply(204);
    }
    if (req.method === "GET" && path.startsWith("/v1/fleets/f/members/m")) {
      const view = views.shift();
      if (view === undefined) return void setTimeout(() => reply(200, { state: "active", revision: "99", held: [], releasing: [] }), 200);
      return reply(200, view);
    }
    if (path.startsWith("/v1/watch")) return void res.writeHead(200, { "content-type": "text/event-stream" }).write("id: 1\n\n");
    reply(404, { type: "about:blank", title: "no", status: 404 });
  });
  after(() => {
    server.closeAllConnections();
    server.close();
  });

  const held = (resource: string, token: string) => ({ resource, lease_id: "9", token, fencing_token: `v1.k1.0.${token}.x.y` });

  test("assignments become leases; moved ones are aborted, handed off and released after their work", async () => {
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    const client = new Client(`http://127.0.0.1:${(server.address() as AddressInfo).port}`);
    views.push(
      { state: "active", revision: "10", held: [held("a", "5"), held("b", "6")], releasing: [] },
      { state: "active", revision: "11", held: [held("a", "5")], releasing: [{ resource: "b", deadline_ms: 2000 }] },
      { state: "active", revision: "12", held: [held("a", "7"), held("c", "8")], releasing: [] },
      { state: "evicted", revision: "13", held: [], releasing: [] },
    );
    const joining = performance.now();
    const member = await client.joinFleet("f", { member: "m", ttlSeconds: 30, pollWaitMs: 100 });
    const seen: string[] = [];
    const stopped: string[] = [];
    const releaseBy = new Map<string, number | undefined>();
    await member.run(async (lease, signal) => {
      seen.push(`${lease.resource}:${lease.token}`);
      await new Promise<void>((resolve) => signal.addEventListener("abort", () => resolve(), { once: true }));
      stopped.push(`${lease.resource}:${(signal.reason as { reason: string }).reason}`);
      releaseBy.set(`${lease.resource}:${lease.token}`, lease.releaseBy);
    });
    assert.deepEqual(seen, ["a:5", "b:6", "a:7", "c:8"]);
    assert.deepEqual(stopped.sort(), ["a:revoked", "a:revoked", "b:handed-off", "c:revoked"]);
    // The answer's arrival plus its deadline_ms (2000) less the 200 ms margin; none for the revoked.
    const by = releaseBy.get("b:6");
    assert.ok(by !== undefined && by >= joining + 1800 && by <= performance.now() + 1800, `b's releaseBy ${by}`);
    assert.deepEqual(["a:5", "a:7", "c:8"].map((l) => releaseBy.get(l)), [undefined, undefined, undefined]);
    await eventually(async () => released.includes("b"), 2000, "b released after its work stopped");
    assert.equal(member.held.length, 0);
    await member.leave();
  });

  test("a grant is delivered once; one moved away before it was seen is released at once", async () => {
    const client = new Client(`http://127.0.0.1:${(server.address() as AddressInfo).port}`);
    released.length = 0;
    views.push(
      { state: "active", revision: "20", held: [held("x", "5")], releasing: [] },
      // The work on x@5 returned and released it; this view was read before that release.
      { state: "active", revision: "21", held: [held("x", "5")], releasing: [] },
      // y was granted and moved away between two reads.
      { state: "active", revision: "22", held: [held("x", "6")], releasing: [{ resource: "y", deadline_ms: 2000 }] },
      { state: "evicted", revision: "23", held: [], releasing: [] },
    );
    const member = await client.joinFleet("f", { member: "m", ttlSeconds: 30, pollWaitMs: 100 });
    const seen: string[] = [];
    await member.run(async (lease) => {
      seen.push(`${lease.resource}:${lease.token}`);
    });
    assert.deepEqual(seen, ["x:5", "x:6"]);
    await eventually(async () => released.includes("y"), 2000, "y released at once");
    assert.ok(released.includes("x"), "a resource is given back when its work returns");
  });

  test("a lease taken back is not released over its successor", async () => {
    const client = new Client(`http://127.0.0.1:${(server.address() as AddressInfo).port}`);
    released.length = 0;
    views.push(
      { state: "active", revision: "30", held: [held("z", "5")], releasing: [] },
      // z@5 taken back and z granted again to this member: the session's secret would release z@7 too.
      { state: "active", revision: "31", held: [held("z", "7")], releasing: [] },
      { state: "evicted", revision: "32", held: [], releasing: [] },
    );
    const member = await client.joinFleet("f", { member: "m", ttlSeconds: 30, pollWaitMs: 100 });
    const seen: string[] = [];
    await member.run(async (lease, signal) => {
      seen.push(`${lease.resource}:${lease.token}`);
      if (!signal.aborted) await new Promise((resolve) => signal.addEventListener("abort", resolve, { once: true }));
    });
    assert.deepEqual(seen, ["z:5", "z:7"]);
    assert.deepEqual(released, [], "no release for grants the member no longer held");
  });

  test("a malformed assignment changes nothing: not believed, read again", { timeout: 15_000 }, async () => {
    const client = new Client(`http://127.0.0.1:${(server.address() as AddressInfo).port}`);
    const a = held("a", "5");
    views.push(
      { state: "active", revision: "50", held: [a], releasing: [] },
      // b granted under another lease than the member's session (9): not the member's.
      { state: "active", revision: "51", held: [a, { ...held("b", "6"), lease_id: "8" }], releasing: [] },
      { state: "active", revision: "52", held: [a, held("c", "twelve")], releasing: [] },
      { state: "active", revision: "53", held: [a], releasing: [{ resource: "d" }] },
      { state: "evicted", revision: "54", held: [], releasing: [] },
    );
    const member = await client.joinFleet("f", { member: "m", ttlSeconds: 30, pollWaitMs: 100 });
    const seen: string[] = [];
    const stopped: string[] = [];
    await member.run(async (lease, signal) => {
      seen.push(`${lease.resource}:${lease.token}`);
      if (!signal.aborted) await new Promise((resolve) => signal.addEventListener("abort", resolve, { once: true }));
      stopped.push(`${lease.resource}:${reasonOf(signal.reason)}`);
    });
    assert.deepEqual(seen, ["a:5"]);
    assert.deepEqual(stopped, ["a:revoked"], "a's work went on until the eviction");
  });

  test("an older assignment never brings a lease back, and is not polled again in a tight loop", async () => {
    const client = new Client(`http://127.0.0.1:${(server.address() as AddressInfo).port}`);
    const older = { state: "active", revision: "40", held: [held("a", "5"), held("b", "6")], releasing: [] };
    views.push(
      older,
      { state: "active", revision: "41", held: [held("a", "5")], releasing: [{ resource: "b", deadline_ms: 2000 }] },
      { state: "active", revision: "42", held: [held("a", "5")], releasing: [] },
      // Answered at once after revision 42 was read (a lagging replica, a reordering relay):
      // b@6, handed off since, is not this member's any more.
      ...Array.from({ length: 5 }, () => older),
      { state: "evicted", revision: "43", held: [], releasing: [] },
    );
    const member = await client.joinFleet("f", { member: "m", ttlSeconds: 30, pollWaitMs: 100 });
    const seen: string[] = [];
    let olderFrom = 0;
    await member.run(async (lease, signal) => {
      seen.push(`${lease.resource}:${lease.token}`);
      if (!signal.aborted) await new Promise((resolve) => signal.addEventListener("abort", resolve, { once: true }));
      if (lease.resource === "b") olderFrom = performance.now();
    });
    const took = performance.now() - olderFrom;
    assert.deepEqual(seen, ["a:5", "b:6"]);
    assert.ok(took >= 400, `five older answers were polled past in ${took.toFixed(0)} ms: no pause between them`);
  });
});
