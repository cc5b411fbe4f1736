/** The pure parts, without a server: the event-stream parser, the timing rules, names, errors. */

import assert from "node:assert/strict";
import { getEventListeners } from "node:events";
import { test } from "node:test";

import { CompactedError, HeldError, LostError, ProblemError, SessionLostError, errorFor, isTransient } from "../src/errors.js";
import { segment } from "../src/http.js";
import { ends } from "../src/losswatch.js";
import { Liveness } from "../src/liveness.js";
import { MAX_LIFETIME_MS, lifetimeMs, renewIntervalMs } from "../src/model.js";
import { link } from "../src/signals.js";
import { MAX_LINE, Parser, type Message } from "../src/sse.js";

const STREAM =
  "id: 41\n\n: keepalive\n\nid: 42.0\nevent: acquired\ndata: {\"a\":1}\n\nid:43.1\r\nevent:released\r\ndata: line one\r\ndata:line two\r\nretry: 1000\r\nunknown: x\r\n\r\ndata\n\n";
const EXPECTED: Message[] = [
  { id: "41" },
  { id: "42.0", event: "acquired", data: '{"a":1}' },
  { id: "43.1", event: "released", data: "line one\nline two" },
  { data: "" },
];

test("event-stream messages are parsed whole, whatever the chunk boundaries", () => {
  const bytes = new TextEncoder().encode(STREAM);
  assert.deepEqual(new Parser().feed(bytes), EXPECTED);
  for (let size = 1; size <= 7; size++) {
    const parser = new Parser();
    const got: Message[] = [];
    for (let i = 0; i < bytes.length; i += size) got.push(...parser.feed(bytes.subarray(i, i + size)));
    assert.deepEqual(got, EXPECTED, `chunks of ${size}`);
  }
  const parser = new Parser();
  assert.deepEqual(parser.feed(new TextEncoder().encode("id: 7\r\rid: 8\ndata: x")), [{ id: "7" }]);
  assert.deepEqual(parser.feed(new TextEncoder().encode("\n\n")), [{ id: "8", data: "x" }]);
});

test("a line or a message over the limit stops the parser", () => {
  const parser = new Parser();
  const head = new TextEncoder().encode("id: 1\ndata: x\n\nid: 2\ndata: ");
  assert.equal(parser.feed(head).length, 1);
  assert.deepEqual(parser.feed(new Uint8Array(MAX_LINE).fill(0x61)), []);
  assert.equal(parser.overflowed, true);
  assert.deepEqual(parser.feed(new TextEncoder().encode("\n\nid: 3\n\n")), []);
  const many = new Parser();
  const line = new TextEncoder().encode(`data: ${"b".repeat(1000)}\n`);
  for (let i = 0; i <= MAX_LINE / 1000; i++) many.feed(line);
  assert.equal(many.overflowed, true);
});

test("a lifetime is the expiry held to the TTL (plus a wait), and zero without a TTL", () => {
  assert.equal(lifetimeMs(3, 2900), 2900);
  assert.equal(lifetimeMs(3, 1e15), 3000);
  assert.equal(lifetimeMs(3, 7000, 5000), 7000);
  assert.equal(lifetimeMs(3, 1e15, 5000), 8000);
  assert.equal(lifetimeMs(1e12, 1e15), MAX_LIFETIME_MS);
  assert.equal(lifetimeMs(0, 5000, 5000), 0);
  for (let i = 0; i < 100; i++) {
    const r = renewIntervalMs(3000, Math.random);
    assert.ok(r >= 900 && r <= 1100);
  }
  assert.equal(renewIntervalMs(0, Math.random), 100);
});

test("names are sent as one path segment", () => {
  assert.equal(segment("aisle-1.a_b:c"), "aisle-1.a_b:c");
  assert.equal(segment("x/../victim"), "x%2F..%2Fvictim");
  assert.equal(segment("job?x#y z%"), "job%3Fx%23y%20z%25");
  assert.equal(segment("é"), "%C3%A9");
  for (const dots of ["", ".", ".."]) assert.equal(segment(dots), "...");
});

test("problems become their errors", () => {
  const body = (o: object) => new TextEncoder().encode(JSON.stringify(o));
  const base = "https://lease-proxy.dev/problems/";
  const held = errorFor(409, new Headers({ "retry-after": "2" }), body({ type: `${base}lease-held`, title: "t", status: 409, holder: "bob", token: "42", expires_in_ms: 900 }));
  assert.ok(held instanceof HeldError && held.token === 42n && held.expiresInMs === 900 && held.retryAfterSeconds === 2);
  assert.ok(errorFor(410, new Headers(), body({ type: `${base}lease-lost` })) instanceof LostError);
  assert.ok(errorFor(410, new Headers(), body({ type: `${base}session-lost` })) instanceof SessionLostError);
  assert.ok(errorFor(410, new Headers(), body({ type: `${base}events-compacted` })) instanceof CompactedError);
  const unavailable = errorFor(503, new Headers(), body({ type: `${base}etcd-unavailable`, title: "etcd", status: 503 }));
  assert.ok(unavailable instanceof ProblemError && unavailable.slug === "etcd-unavailable" && isTransient(unavailable));
  const raw = errorFor(502, new Headers(), new TextEncoder().encode("bad gateway"));
  assert.ok(raw instanceof ProblemError && raw.problem.detail === "bad gateway" && raw.problem.type === "about:blank");
  assert.equal(isTransient(errorFor(400, new Headers(), body({}))), false);
});

test("an event ends a grant when it names its token, or another grant of its resource", () => {
  const event = (type: "acquired" | "released" | "expired", token: bigint) =>
    ({ id: "1", type, resource: "a", holder: "h", token, revision: 1, leaseId: "7" });
  const held = { token: 10n };
  assert.equal(ends(event("acquired", 10n), held), false);
  assert.equal(ends(event("acquired", 11n), held), true);
  assert.equal(ends(event("acquired", 9n), held), false);
  assert.equal(ends(event("released", 10n), held), true);
  assert.equal(ends(event("expired", 10n), held), true);
  assert.equal(ends(event("released", 9n), held), false);
});

test("past its deadline a lease is lost without any timer, for the first reason only", async () => {
  const session = new Liveness("s", performance.now() + 30);
  const lease = new Liveness("a", 0, session);
  assert.equal(lease.check(), false);
  const end = performance.now() + 40;
  while (performance.now() < end) {
    // busy: no timer can run
  }
  assert.equal(lease.check(), true);
  assert.equal(lease.reason?.reason, "session-lost");
  assert.equal(session.reason?.reason, "expired");
  session.lose("released", "later");
  assert.equal(session.reason?.reason, "expired");
  assert.equal((await lease.lost).reason, "session-lost");
});

test("a link aborts with its first source's reason and then detaches from every source", () => {
  const [a, b] = [new AbortController(), new AbortController()];
  const linked = link(a.signal, undefined, b.signal);
  assert.equal(getEventListeners(a.signal, "abort").length, 1);
  b.abort("b's reason");
  assert.equal(linked.signal.aborted, true);
  assert.equal(linked.signal.reason, "b's reason");
  assert.equal(getEventListeners(a.signal, "abort").length, 0, "detached from the source that did not abort");
  const already = link(new AbortController().signal, b.signal);
  assert.equal(already.signal.reason, "b's reason");
  const disposed = link(a.signal);
  disposed.dispose();
  assert.equal(getEventListeners(a.signal, "abort").length, 0);
  a.abort();
  assert.equal(disposed.signal.aborted, false, "a disposed link is detached");
});

test("a session outliving its leases keeps no listener per lease", () => {
  const session = new Liveness("session", performance.now() + 60_000);
  const before = getEventListeners(session.signal, "abort").length;
  for (let i = 0; i < 50; i++) new Liveness(`r${i}`, 0, session).lose("released", "released");
  assert.equal(getEventListeners(session.signal, "abort").length, before);
  const held = new Liveness("held", 0, session);
  session.lose("revoked", "the session's lease ended");
  assert.equal(held.reason?.reason, "session-lost");
});
