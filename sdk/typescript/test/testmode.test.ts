/**
 * The test mode, as an application's tests use it: a job that counts an aisle under a lease and
 * must stop, and say so, when the lease is lost or its token refused. The faults are injected by
 * the client (`testMode`), against a real proxy; the seed makes a run repeatable.
 */

import assert from "node:assert/strict";
import { before, test } from "node:test";

import { Client, LostError, type TestMode } from "../src/index.js";
import { startEtcd, startProxy, unique } from "./harness.js";

let proxy: string;
before(async () => {
  proxy = (await startProxy(await startEtcd())).url;
});

/** The application's code under test: count until done, stop on loss or refusal. */
async function countAisle(client: Client, aisle: string, storage: string): Promise<string> {
  try {
    return await client.using(aisle, { holder: "robot", ttlSeconds: 2 }, async (lease, signal) => {
      for (let i = 0; i < 8; i++) {
        await new Promise((resolve, reject) => {
          const stop = () => (clearTimeout(timer), reject(signal.reason));
          const timer = setTimeout(() => (signal.removeEventListener("abort", stop), resolve(i)), 300);
          signal.addEventListener("abort", stop, { once: true });
        });
        const answer = await lease.fetch(storage, { method: "PUT", body: String(i) });
        if (answer.status === 409) return "refused";
      }
      return "done";
    });
  } catch (e) {
    if (e instanceof LostError) return `lost:${e.reason}:${e.injected ? "injected" : "real"}`;
    throw e;
  }
}

const storage = "data:,ok"; // fetch answers 200 without a server: the faults are what is tested
const client = (testMode?: TestMode) => new Client(proxy, { testMode });

test("without faults the job finishes", async () => {
  assert.equal(await countAisle(client(), unique(), storage), "done");
});

test("an injected loss reaches the job's code, which stops", async () => {
  assert.equal(await countAisle(client({ lossRate: 1, seed: 7 }), unique(), storage), "lost:revoked:injected");
});

test("an injected token refusal reaches the job's code", async () => {
  assert.equal(await countAisle(client({ tokenRefusalRate: 1 }), unique(), storage), "refused");
});

test("renewals that always fail end the lease at its stop-by deadline", async () => {
  assert.equal(await countAisle(client({ failedRenewalRate: 1 }), unique(), storage), "lost:expired:real");
});

test("the same seed injects the same faults", async () => {
  const draws = (seed: number) => {
    const c = client({ lossRate: 0.5, seed });
    return Array.from({ length: 20 }, () => (c as unknown as { faults: { loseNow(): boolean } }).faults.loseNow());
  };
  assert.deepEqual(draws(42), draws(42));
  assert.notDeepEqual(draws(42), draws(43));
});
