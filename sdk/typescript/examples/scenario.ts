/**
 * The scripted scenario every SDK runs (docs/SDKS.md), with this SDK, against a running stack —
 * lease-proxy, the warehouse inventory behind fence-gateway, etcd —: prints what the SDK let it
 * observe, one line per step: KEY, a tab, the observation. scripts/sdk-scenario.sh runs it beside
 * the other SDKs' runners and compares the lines.
 *
 *     node scenario.js --proxy URL --gateway URL --etcd URL --prefix NAME-
 */

import { parseArgs } from "node:util";

import { Client, LostError, SessionLostError, type FleetMember, type Lease } from "../src/index.js";

const { values: args } = parseArgs({
  options: {
    proxy: { type: "string" },
    gateway: { type: "string" },
    etcd: { type: "string" },
    prefix: { type: "string", default: "ts-" },
  },
});
if (!args.proxy || !args.gateway || !args.etcd) {
  console.error("usage: scenario --proxy URL --gateway URL --etcd URL [--prefix P]");
  process.exit(64);
}
const { proxy, gateway, etcd } = args as { proxy: string; gateway: string; etcd: string };
const prefix = args.prefix ?? "ts-";

/** Each wait of the scenario is bounded by this. */
const WITHIN_MS = 5000;
/** The fleet's drain deadline: a hand-off done in a quarter of it was the member's release. */
const DRAIN_MS = 20_000;

const say = (key: string, observed: string) => console.log(`${key}\t${observed}`);
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

async function eventually(check: () => boolean, what: string): Promise<void> {
  const deadline = performance.now() + WITHIN_MS;
  while (!check()) {
    if (performance.now() > deadline) throw new Error(`${what}: not within ${WITHIN_MS} ms`);
    await sleep(20);
  }
}

const reason = (e: unknown) => (e instanceof LostError ? e.reason : `not lost (${String(e)})`);
const compare = (a: bigint, b: bigint) => (a > b ? "above" : a === b ? "equal to" : "below");

/** The outcome of a write: its status (and the gateway's refusal), or the SDK's refusal to send. */
async function outcome(sent: Promise<Response>): Promise<string> {
  try {
    const response = await sent;
    await response.arrayBuffer();
    const rejection = response.headers.get("fencing-rejection");
    return rejection ? `${response.status} ${rejection}` : String(response.status);
  } catch (e) {
    if (e instanceof LostError) return `refused by the SDK, nothing sent: lost (${e.reason})`;
    return `error: ${(e as Error).message}`;
  }
}

const count = (robot: string, n: number) => ({ method: "PUT", body: JSON.stringify({ robot, count: n }) });

/** A count written through fence-gateway with `lease.fetch`, which adds the lease's token. */
const write = (lease: Lease, robot: string, n: number) => outcome(lease.fetch(`${gateway}/aisles/${lease.resource}/count`, count(robot, n)));

/** A count written with `lease`'s token set by hand, as a holder that missed its loss would. */
async function presented(lease: Lease, robot: string, n: number): Promise<string> {
  const headers = { "fencing-token": lease.fencingToken, "fencing-resource": lease.resource };
  return `token sent anyway: ${await outcome(fetch(`${gateway}/aisles/${lease.resource}/count`, { ...count(robot, n), headers }))}`;
}

/** Revokes an etcd lease through etcd's JSON gateway: a lease lost to etcd. */
async function revoke(leaseId: string): Promise<void> {
  const r = await fetch(`${etcd}/v3/lease/revoke`, { method: "POST", body: JSON.stringify({ ID: leaseId }) });
  if (!r.ok) throw new Error(`revoke ${leaseId}: ${r.status}`);
}

/** Acquire, renew, write through the gateway, a takeover after a forced loss, the old holder's write refused, release. */
async function leases(): Promise<void> {
  const [a, b] = [new Client(proxy, { holder: "a" }), new Client(proxy, { holder: "b" })];
  const aisle = `${prefix}aisle`;
  const old = await a.acquire(aisle, { ttlSeconds: 3 });
  say("lease.acquire", `acquired by ${old.holder}`);
  const first = old.stopBy;
  await eventually(() => old.stopBy > first, "a renewal moving the stop-by deadline on");
  say("lease.renew", `renewed in the background: stop-by later, ${old.isLost() ? `lost (${reason(old.lostReason)})` : "held"}`);
  say("lease.write", await write(old, "a", 1));
  await revoke(old.leaseId);
  const lost = await Promise.race([old.lost, sleep(WITHIN_MS).then(() => undefined)]);
  if (lost === undefined) throw new Error("the revoked lease was not reported lost");
  say("lease.revoke", `a told: lost (${lost.reason})`);
  const newer = await b.acquire(aisle, { ttlSeconds: 3, waitMs: WITHIN_MS });
  say("lease.takeover", `acquired by ${newer.holder}, token ${compare(newer.token, old.token)} a's`);
  say("lease.new-write", await write(newer, "b", 2));
  say("lease.old-write", await write(old, "a", 3));
  say("lease.old-token", await presented(old, "a", 4));
  await newer.release();
  say("lease.release", `released by ${newer.holder}: ${(await b.get(aisle)) === undefined ? "the resource is free" : "the resource is not free"}`);
  await a.close();
  await b.close();
}

/** A mailbox of the leases a member's work starts or ends with, in order. */
class Mailbox {
  private readonly items: Lease[] = [];
  push(lease: Lease): void {
    this.items.push(lease);
  }
  /** The next `n` within the scenario's bound, sorted by resource. */
  async take(n: number): Promise<Lease[]> {
    await eventually(() => this.items.length >= n, `${n} leases`);
    return this.items.splice(0, n).sort((x, y) => x.resource.localeCompare(y.resource));
  }
}

function serve(member: FleetMember) {
  const started = new Mailbox();
  const ended = new Mailbox();
  const done = member.run(async (lease, signal) => {
    started.push(lease);
    if (!signal.aborted) await new Promise((resolve) => signal.addEventListener("abort", resolve, { once: true }));
    ended.push(lease);
  });
  return { started, ended, done };
}

/** A member receives, writes and hands off when a second one joins, drains; a member whose session ends is told. */
async function fleet(): Promise<void> {
  const client = new Client(proxy, { holder: "scenario" });
  const name = `${prefix}fleet`;
  await client.putFleet(name, { resources: [`${name}-1`, `${name}-2`], drainMs: DRAIN_MS });
  const m1 = await client.joinFleet(name, { member: "m1", ttlSeconds: 10, pollWaitMs: 2000 });
  const w1 = serve(m1);
  const got = await w1.started.take(2);
  say("fleet.join", `m1 assigned ${got.length} resources`);
  say("fleet.write", `${await write(got[0], "m1", 1)}; ${await write(got[1], "m1", 1)}`);

  const m2 = await client.joinFleet(name, { member: "m2", ttlSeconds: 10, pollWaitMs: 2000 });
  const joined = performance.now();
  const w2 = serve(m2);
  const [moved] = await w1.ended.take(1);
  say("fleet.second-join", `m1's work on 1 resource ended: ${reason(moved.lostReason)}`);
  const [taken] = await w2.started.take(1);
  const took = performance.now() - joined;
  const when =
    taken.resource !== moved.resource ? "but another resource"
    : took < DRAIN_MS / 4 ? "well within the drain deadline"
    : `after ${took} ms (the service's revocation, not the member's release)`;
  say("fleet.hand-off", `m2 assigned the same resource, token ${compare(taken.token, moved.token)} m1's, ${when}`);
  say("fleet.new-write", await write(taken, "m2", 2));
  say("fleet.old-write", await write(moved, "m1", 3));
  say("fleet.old-token", await presented(moved, "m1", 4));

  await m1.drain();
  const [drained] = await w1.ended.take(1);
  const [rest] = await w2.started.take(1);
  say("fleet.drain", `m1's work on 1 resource ended: ${reason(drained.lostReason)}; m2 assigned it: ${rest.resource === drained.resource}`);

  await revoke(m2.session.id);
  const ended = await w2.ended.take(2);
  const lost = ended.filter((l) => l.lostReason instanceof LostError).length;
  await Promise.race([w2.done, sleep(WITHIN_MS).then(() => Promise.reject(new Error("m2's run did not end after its session ended")))]);
  const why = m2.signal.reason;
  say("fleet.session-end", `m2's work on ${lost} resources ended: lost; the member ended: ${why instanceof LostError ? "session lost" : String(why)}`);
  await m1.leave();
  await w1.done;
  await client.deleteFleet(name);
  await client.close();
}

try {
  await leases();
  await fleet();
  process.exit(0);
} catch (e) {
  say("failed", e instanceof SessionLostError ? `session lost: ${e.message}` : (e as Error).message);
  process.exit(1);
}
