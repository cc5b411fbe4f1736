/**
 * A hostile proxy (node:http, scripted): malformed, slow, dripping, truncated, oversized and
 * reordered answers. Each must be a clear error, and never a lease the client believes it holds
 * when the answers do not say so.
 */

import assert from "node:assert/strict";
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { after, test } from "node:test";

import { Client, HeldError, LostError, ProtocolError, TimeoutError, TransportError } from "../src/index.js";
import { eventually, sleep } from "./harness.js";

type Handler = (req: IncomingMessage, res: ServerResponse) => void | Promise<void>;

/** The fake: one handler per "METHOD path" (resource names are literal), an open event stream. */
const routes = new Map<string, Handler>();
const streams: ServerResponse[] = [];
/** The Last-Event-ID each of `streams` was opened with. */
const resumedAfter: (string | undefined)[] = [];
const server = createServer((req, res) => {
  const path = (req.url ?? "").split("?")[0];
  const handler = routes.get(`${req.method} ${path}`);
  if (req.method === "GET" && path === "/v1/watch" && handler === undefined) {
    res.writeHead(200, { "content-type": "text/event-stream" });
    res.write("id: 1\n\n");
    streams.push(res);
    resumedAfter.push(req.headers["last-event-id"] as string | undefined);
    return;
  }
  if (handler === undefined && req.method === "DELETE") {
    res.writeHead(204).end(); // releases always succeed
    return;
  }
  if (handler === undefined) {
    res.writeHead(404, { "content-type": "application/problem+json" }).end('{"type":"about:blank","title":"no","status":404}');
    return;
  }
  void handler(req, res);
});
await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
after(() => {
  for (const s of streams) s.destroy();
  server.closeAllConnections();
  server.close();
});

function grant(resource: string, fields: Record<string, unknown> = {}): string {
  const token = fields.token ?? "50";
  return JSON.stringify({
    resource, holder: "h", lease_id: "7", secret: "s", token, fencing_token: `v1.k1.0.${token}.x.y`,
    ttl_seconds: 2, expires_in_ms: 2000, ...fields,
  });
}

function json(status: number, body: string): Handler {
  return (_req, res) => void res.writeHead(status, { "content-type": "application/json" }).end(body);
}

function event(type: string, resource: string, token: string, revision: number): string {
  const data = { type, resource, holder: "h", token, revision, lease_id: "7" };
  return `id: ${revision}.0\nevent: ${type}\ndata: ${JSON.stringify(data)}\n\n`;
}

const client = new Client(url, { timeoutMs: 800 });

test("malformed acquire answers are ProtocolErrors, never a lease", async () => {
  const cases: [string, string][] = [
    ["not JSON", "<html>"],
    ["an array", "[]"],
    ["a field missing", JSON.stringify({ resource: "m", holder: "h" })],
    ["a token that is not decimal", grant("m", { token: "12abc" })],
    ["a number as token", grant("m", { token: 12 })],
    ["a negative TTL", grant("m", { ttl_seconds: -1 })],
    ["a fractional expiry", grant("m", { expires_in_ms: 1.5 })],
    ["a grant of another resource", grant("other")],
    ["a fencing token of another revision", grant("m", { fencing_token: "v1.k1.0.49.x.y" })],
  ];
  for (const [what, body] of cases) {
    routes.set("POST /v1/leases/m", json(201, body));
    await assert.rejects(client.acquire("m", { holder: "h", ttlSeconds: 2 }), ProtocolError, what);
  }
  routes.set("POST /v1/leases/m", (_q, res) =>
    void res.writeHead(409, { "content-type": "application/problem+json" })
      .end('{"type":"https://lease-proxy.dev/problems/lease-held","title":"held","status":409,"holder":"x","token":"-1"}'));
  await assert.rejects(client.acquire("m", { holder: "h", ttlSeconds: 2 }), ProtocolError);
  routes.set("POST /v1/leases/m", (_q, res) =>
    void res.writeHead(409, { "content-type": "application/problem+json", "retry-after": "3" })
      .end('{"type":"https://lease-proxy.dev/problems/lease-held","title":"held","status":409,"holder":"x","token":"9","expires_in_ms":100}'));
  await assert.rejects(client.acquire("m", { holder: "h", ttlSeconds: 2 }), (e: unknown) =>
    e instanceof HeldError && e.token === 9n && e.retryAfterSeconds === 3);
});

test("an absurd expiry is held to the TTL; an answer granting no time is a lease already lost", async () => {
  routes.set("POST /v1/leases/big", json(201, grant("big", { expires_in_ms: Number.MAX_SAFE_INTEGER })));
  routes.set("POST /v1/leases/big/renew", json(500, "{}"));
  const sent = performance.now();
  const big = await client.acquire("big", { holder: "h", ttlSeconds: 2 });
  assert.ok(big.stopBy <= sent + 2000, "no later than the TTL after sending");
  big.pauseRenewals(true);
  // The deadline counts from before the request was sent: a slow answer shortens it.
  routes.set("POST /v1/leases/slowgrant", (_q, res) =>
    void setTimeout(() => res.writeHead(201, { "content-type": "application/json" }).end(grant("slowgrant")), 600));
  const before = performance.now();
  const slow = await client.acquire("slowgrant", { holder: "h", ttlSeconds: 2 });
  slow.pauseRenewals(true);
  assert.ok(slow.stopBy < before + 2000 - 200 + 50, `deadline ${(slow.stopBy - before).toFixed(0)} ms after sending`);
  routes.set("POST /v1/leases/zero", json(201, grant("zero", { ttl_seconds: 0 })));
  const zero = await client.acquire("zero", { holder: "h", ttlSeconds: 2 });
  assert.equal(zero.isLost(), true);
  assert.equal(zero.lostReason?.reason, "expired");
  await assert.rejects(client.using("zero", { holder: "h", ttlSeconds: 2 }, async () => "ran"), LostError);
});

test("slow headers, a dripping body and a truncated body are timeouts and transport errors", async () => {
  routes.set("GET /v1/leases/slow", () => {}); // never answers
  let t0 = performance.now();
  await assert.rejects(client.get("slow"), TimeoutError);
  assert.ok(performance.now() - t0 < 1500);
  routes.set("GET /v1/leases/drip", async (_q, res) => {
    res.writeHead(200, { "content-type": "application/json" });
    for (let i = 0; i < 100 && !res.destroyed; i++) {
      res.write(" ");
      await sleep(50);
    }
    res.end("{}");
  });
  t0 = performance.now();
  await assert.rejects(client.get("drip"), TimeoutError);
  assert.ok(performance.now() - t0 < 1500, "the timeout covers the body");
  routes.set("GET /v1/leases/cut", (_q, res) => {
    res.writeHead(200, { "content-type": "application/json", "content-length": "100" });
    res.write('{"resource":');
    setTimeout(() => res.destroy(), 20);
  });
  await assert.rejects(client.get("cut"), (e: unknown) => e instanceof TransportError && !(e instanceof TimeoutError));
  routes.set("GET /v1/leases/huge", (_q, res) => {
    res.writeHead(200, { "content-type": "application/json" });
    res.end(`"${"a".repeat(2 << 20)}"`);
  });
  await assert.rejects(client.get("huge"), /over 1048576 bytes/);
});

test("a renewal granting no time, or naming another grant, loses the lease at once", async () => {
  for (const [resource, renewal, why] of [
    ["r0", { ttl_seconds: 0, expires_in_ms: 0, token: "50" }, /granted no time/],
    ["r1", { ttl_seconds: 2, expires_in_ms: 2000, token: "51" }, /another grant/],
  ] as const) {
    routes.set(`POST /v1/leases/${resource}`, json(201, grant(resource)));
    routes.set(`POST /v1/leases/${resource}/renew`, json(200, JSON.stringify(renewal)));
    const lease = await client.acquire(resource, { holder: "h", ttlSeconds: 2 });
    const lost = await lease.lost;
    assert.match(lost.message, why);
    assert.ok(performance.now() < lease.stopBy, "before the deadline");
  }
});

test("a renewal refused with another 4xx loses the lease; a 429 is retried", async () => {
  routes.set("POST /v1/leases/r403", json(201, grant("r403")));
  routes.set("POST /v1/leases/r403/renew", (_q, res) =>
    void res.writeHead(403, { "content-type": "application/problem+json" })
      .end('{"type":"https://lease-proxy.dev/problems/other-principal","title":"Forbidden","status":403}'));
  const refused = await client.acquire("r403", { holder: "h", ttlSeconds: 2 });
  const lost = await refused.lost;
  assert.equal(lost.reason, "revoked");
  assert.ok(performance.now() < refused.stopBy, "at once, before the deadline");
  routes.set("POST /v1/leases/r429", json(201, grant("r429")));
  let asked = 0;
  routes.set("POST /v1/leases/r429/renew", (_q, res) => {
    asked++;
    res.writeHead(429, { "retry-after": "1", "content-type": "application/problem+json" }).end("{}");
  });
  const limited = await client.acquire("r429", { holder: "h", ttlSeconds: 2 });
  assert.equal((await limited.lost).reason, "expired");
  assert.ok(asked > 1, "retried");
});

test("malformed renewals are retried, never believed: the lease ends at its deadline", async () => {
  routes.set("POST /v1/leases/bad", json(201, grant("bad")));
  routes.set("POST /v1/leases/bad/renew", json(200, '{"ttl_seconds":"2"}'));
  const lease = await client.acquire("bad", { holder: "h", ttlSeconds: 2 });
  const stopBy = lease.stopBy;
  const lost = await lease.lost;
  assert.equal(lost.reason, "expired");
  assert.ok(performance.now() >= stopBy && performance.now() - stopBy < 200);
});

test("a renewal answer arriving after the deadline does not bring the lease back", async () => {
  routes.set("POST /v1/leases/late", json(201, grant("late")));
  let answered = 0;
  routes.set("POST /v1/leases/late/renew", async (_q, res) => {
    await sleep(2500); // past the stop-by deadline
    answered++;
    res.writeHead(200, { "content-type": "application/json" }).end('{"ttl_seconds":2,"expires_in_ms":2000,"token":"50"}');
  });
  const late = new Client(url, { timeoutMs: 5000, watchLoss: false });
  const lease = await late.acquire("late", { holder: "h", ttlSeconds: 2 });
  assert.equal((await lease.lost).reason, "expired");
  await eventually(async () => answered >= 1, 5000, "the late answer");
  await sleep(50);
  assert.equal(lease.isLost(), true);
  assert.equal(lease.signal.aborted, true);
  await lease.release().catch(() => {});
});

test("an end event that arrives before the acquire's answer still loses the new lease", async () => {
  routes.set("POST /v1/leases/ev-a", json(201, grant("ev-a", { token: "60", ttl_seconds: 10, expires_in_ms: 10_000 })));
  routes.set("POST /v1/leases/ev-a/renew", json(200, '{"ttl_seconds":10,"expires_in_ms":10000,"token":"60"}'));
  const first = await client.acquire("ev-a", { holder: "h", ttlSeconds: 10 });
  while (streams.length === 0) await sleep(10);
  routes.set("POST /v1/leases/ev-b", (_q, res) => {
    for (const s of streams) s.write(event("expired", "ev-b", "61", 70)); // reordered: the end first
    setTimeout(() => res.writeHead(201, { "content-type": "application/json" })
      .end(grant("ev-b", { token: "61", ttl_seconds: 10, expires_in_ms: 10_000 })), 100);
  });
  const second = await client.acquire("ev-b", { holder: "h", ttlSeconds: 10 });
  assert.equal(second.isLost(), true);
  assert.match(second.lostReason?.message ?? "", /event stream: expired at revision 70/);
  // An event for an older grant of the same resource, or another resource, changes nothing
  // (on the stream opened again for the resources held now).
  await eventually(async () => resumedAfter.includes("61"), 2000, "the stream opened again after the new grant");
  for (const s of streams) s.write(event("released", "ev-a", "59", 71) + event("released", "ev-aa", "60", 72));
  await sleep(100);
  assert.equal(first.isLost(), false);
  for (const s of streams) s.write(event("acquired", "ev-a", "80", 73));
  assert.match((await first.lost).message, /acquired by h \(token 80\)/);
  await first.release();
});

test("the event stream: a malformed event is an error and the stream goes on; a cut message is dropped", async () => {
  let connection = 0;
  const resumes: (string | undefined)[] = [];
  routes.set("GET /v1/watch", (req, res) => {
    if (!(req.url ?? "").includes("prefix=wt")) {
      res.writeHead(200, { "content-type": "text/event-stream" }).write("id: 1\n\n");
      streams.push(res); // another client's loss stream
      return;
    }
    connection++;
    resumes.push(req.headers["last-event-id"] as string | undefined);
    res.writeHead(200, { "content-type": "text/event-stream" });
    if (connection === 1) {
      res.write("id: 1\n\nid: 2.0\nevent: acquired\ndata: {\"type\":\"stolen\"}\n\n");
      res.write(event("acquired", "wt", "3", 3));
      res.write("id: 4.0\nevent: released\ndata: {\"type\":\"rele"); // cut
      setTimeout(() => res.destroy(), 50);
    } else {
      res.write(event("released", "wt", "3", 4));
    }
  });
  const events = client.watch({ prefix: "wt" });
  await assert.rejects(events.next(), ProtocolError);
  assert.equal((await events.next()).value.id, "3.0");
  const released = (await events.next()).value;
  assert.deepEqual([released.type, released.id], ["released", "4.0"]);
  assert.deepEqual(resumes, [undefined, "3.0"]);
  await events.return();
  routes.delete("GET /v1/watch");
});
