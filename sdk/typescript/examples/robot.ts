/**
 * A warehouse robot in TypeScript, doing the Rust robots' job (examples/src/bin/warehouse) with
 * this SDK: lease an aisle, count it, write each count straight to fence-gateway (in front of
 * the inventory) with the lease's token on every request (`lease.fetch`), let the lease renew
 * itself, stop the moment it is lost — the work is aborted through the lease's signal — and
 * release. One `event …` line per outcome:
 *
 *     event acquired AISLE TOKEN | event write-ok AISLE | event refused AISLE STATUS SLUG
 *     event lost AISLE REASON | event released AISLE | event error MESSAGE
 *
 *     node robot.js --proxy http://127.0.0.1:7070 --gateway http://127.0.0.1:7071 \
 *                   --aisles aisle-1,aisle-2 --name ts-robot [--ttl 3] [--rounds 0] [--updates 0]
 *
 * With `--fleet aisles` (instead of `--aisles`) it joins that fleet as member `--name` and counts
 * whatever aisles the service assigns it, each until it is moved away (`event lost AISLE
 * handed-off`, then released) or the member's session is lost; SIGINT leaves the fleet.
 */

import { parseArgs } from "node:util";

import { Client, HeldError, LeaseProxyError, LostError, type Lease } from "../src/index.js";

const { values: args } = parseArgs({
  options: {
    proxy: { type: "string" },
    gateway: { type: "string" },
    aisles: { type: "string" },
    name: { type: "string" },
    ttl: { type: "string", default: "3" },
    rounds: { type: "string", default: "0" },
    updates: { type: "string", default: "0" },
    "count-ms": { type: "string", default: "250" },
    fleet: { type: "string" },
  },
});
if (!args.proxy || !args.gateway || !(args.aisles || args.fleet) || !args.name) {
  console.error("usage: robot --proxy URL --gateway URL (--aisles A,B | --fleet F) --name NAME [--ttl S] [--rounds N] [--updates N]");
  process.exit(64);
}
const name = args.name;
const gateway = args.gateway;
const say = (line: string) => console.log(`event ${line}`);

/** Counting takes a while; aborted the moment the lease is lost. */
function count(signal: AbortSignal): Promise<number> {
  const ms = Number(args["count-ms"]) * (0.4 + 1.2 * Math.random());
  return new Promise((resolve, reject) => {
    const stop = () => (clearTimeout(timer), reject(signal.reason));
    const timer = setTimeout(() => (signal.removeEventListener("abort", stop), resolve(Math.floor(Math.random() * 500))), ms);
    signal.addEventListener("abort", stop, { once: true });
  });
}

/**
 * Counts `aisle` under `lease`: `updates` writes through the gateway, each with the token; false
 * once a write was refused.
 */
async function work(lease: Lease, signal: AbortSignal, aisle: string): Promise<boolean> {
  const updates = Number(args.updates) || 3 + Math.floor(Math.random() * 6);
  for (let i = 0; i < updates; i++) {
    const counted = await count(signal);
    const response = await lease.fetch(`${gateway}/aisles/${aisle}/count`, {
      method: "PUT",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ robot: name, count: counted }),
    });
    if (response.ok) {
      say(`write-ok ${aisle}`);
      continue;
    }
    const problem = (await response.json().catch(() => ({}))) as { type?: string };
    say(`refused ${aisle} ${response.status} ${String(problem.type ?? "").split("/").pop()}`);
    return false; // a newer holder has written: this robot is not the holder any more
  }
  return true;
}

const client = new Client(args.proxy, { token: process.env.WAREHOUSE_TOKEN });
if (args.fleet !== undefined) await asMember(args.fleet);
else await byLease(args.aisles?.split(",").filter(Boolean) ?? []);

/** Leases aisles one after the other, at random. */
async function byLease(aisles: string[]): Promise<void> {
  const rounds = Number(args.rounds);
  for (let done = 0; rounds === 0 || done < rounds; done++) {
    const aisle = aisles[Math.floor(Math.random() * aisles.length)];
    try {
      await client.using(aisle, { holder: name, ttlSeconds: Number(args.ttl), waitMs: 5000 }, async (lease, signal) => {
        say(`acquired ${aisle} ${lease.token}`);
        await work(lease, signal, aisle);
      });
      say(`released ${aisle}`);
    } catch (e) {
      if (e instanceof LostError) say(`lost ${aisle} ${e.reason}`);
      else if (e instanceof HeldError) continue;
      else if (e instanceof LeaseProxyError) say(`error ${e.message}`);
      else throw e;
    }
  }
}

/** Counts whatever the fleet assigns, each aisle until it is moved away or lost. */
async function asMember(fleet: string): Promise<void> {
  const member = await client.joinFleet(fleet, { member: name, ttlSeconds: Number(args.ttl) });
  process.once("SIGINT", () => void member.leave().catch(() => {}));
  await member.run(async (lease, signal) => {
    say(`acquired ${lease.resource} ${lease.token}`);
    try {
      while (await work(lease, signal, lease.resource));
    } catch (e) {
      if (e instanceof LostError) say(`lost ${lease.resource} ${e.reason}`);
      else throw e;
    }
  });
}
