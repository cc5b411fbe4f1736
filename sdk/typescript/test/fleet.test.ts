/**
 * Fleets. Against the real proxy (when its binary serves `/v1/fleets`; skipped, saying so,
 * when it does not): a member receives its resources, writes through fence-gateway with their
 * tokens, hands half off when a second member joins — its work aborted, its old token refused
 * by the gateway once the new holder wrote — and everything on drain. Against a scripted proxy
 * following the contract (DESIGN §5.5): how assignments become leases.
 */

import assert from "node:assert/strict";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { after, before, describe, test } from "node:test";

import { Client, type AssignmentChange, type FleetMember } from "../src/index.js";
import { eventually, startEtcd, startProxy, startWarehouse, unique } from "./harness.js";

let proxy: string;
let gateway: string;
let fleetsServed = false;

before(async () => {
  const etcd = await startEtcd();
  ({ gateway } = await startWarehouse());
  proxy = (await startProxy(etcd, ["--upstream", gateway, "--prefence-url", gateway])).url;
  const probe = await fetch(`${proxy}/v1/fleets/probe`);
  fleetsServed = probe.status !== 404 || !(await probe.text()).includes("no-route");
});

/** The next change of `changes` that satisfies `want`. */
async function until(changes: AsyncGenerator<AssignmentChange>, want: (c: AssignmentChange) => boolean): Promise<AssignmentChange> {
  for (;;) {
    const next = await changes.next();
    assert.ok(!next.done, "the assignments ended");
    if (want(next.value)) return next.value;
  }
}

const put = (lease: { fetch: typeof fetch }, aisle: string, robot: string) =>
  lease.fetch(`${gateway}/aisles/${aisle}/count`, { method: "PUT", body: JSON.stringify({ robot, count: 1 }) });

describe("against the proxy", () => {
  test("a member receives, writes and hands off", async (t) => {
    if (!fleetsServed) return t.skip("this lease-proxy binary does not serve /v1/fleets yet");
    const client = new Client(proxy);
    const fleet = unique("aisles");
    const aisles = [1, 2, 3, 4].map((n) => `${fleet}-${n}`);
    await client.putFleet(fleet, { resources: aisles, drainMs: 2000 });
    const m1: FleetMember = await client.joinFleet(fleet, { member: "m1", ttlSeconds: 5, pollWaitMs: 2000 });
    const c1 = m1.assignments();
    const first = await until(c1, (c) => c.held.length === 4);
    for (const lease of first.held) assert.equal((await put(lease, lease.resource, "m1")).status, 200);

    const m2 = await client.joinFleet(fleet, { member: "m2", ttlSeconds: 5, pollWaitMs: 2000 });
    const moved = await until(c1, (c) => c.releasing.length > 0);
    for (const lease of moved.releasing) {
      assert.equal(lease.signal.aborted, true);
      assert.equal(lease.lostReason?.reason, "handed-off");
      await lease.release();
    }
    const c2 = m2.assignments();
    const second = await until(c2, (c) => c.held.length >= 1);
    const taken = second.held[0];
    assert.equal((await put(taken, taken.resource, "m2")).status, 200);
    const old = moved.releasing.find((l) => l.resource === taken.resource);
    assert.ok(old !== undefined && taken.token > old.token);
    const stale = await fetch(`${gateway}/aisles/${taken.resource}/count`, {
      method: "PUT",
      headers: { "fencing-token": old.fencingToken, "fencing-resource": old.resource },
      body: JSON.stringify({ robot: "m1", count: 2 }),
    });
    assert.equal(stale.status, 409, "the old holder's token is refused once the new one wrote");

    await m1.drain();
    const drained = await until(c1, (c) => c.held.length === 0);
    for (const lease of drained.releasing) await lease.release();
    await until(c2, (c) => c.held.length === 4);
    await m1.leave();
    await m2.leave();
    await client.deleteFleet(fleet);
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
    const member = await client.joinFleet("f", { member: "m", ttlSeconds: 30, pollWaitMs: 100 });
    const seen: string[] = [];
    const stopped: string[] = [];
    await member.run(async (lease, signal) => {
      seen.push(`${lease.resource}:${lease.token}`);
      await new Promise<void>((resolve) => signal.addEventListener("abort", () => resolve(), { once: true }));
      stopped.push(`${lease.resource}:${(signal.reason as { reason: string }).reason}`);
    });
    assert.deepEqual(seen, ["a:5", "b:6", "a:7", "c:8"]);
    assert.deepEqual(stopped.sort(), ["a:revoked", "a:revoked", "b:handed-off", "c:revoked"]);
    await eventually(async () => released.includes("b"), 2000, "b released after its work stopped");
    assert.equal(member.held.length, 0);
    await member.leave();
  });
});
