/**
 * The client's test mode, after FoundationDB's client-side buggify: faults injected at set rates
 * so an application's tests run its on-lost paths. Off unless `testMode` is given; nothing here
 * runs otherwise.
 */

import { ProblemError, PROBLEM_BASE } from "./errors.js";

/** Rates (0–1) of the faults the test mode injects, and the seed that makes a run repeatable. */
export interface TestMode {
  /** At each renewal due: the lease (or session) is lost (`revoked`, `injected` set) and released. */
  lossRate?: number;
  /** At each renewal due: it is sent late, after a pause of up to the whole lifetime granted. */
  lateRenewalRate?: number;
  /** At each renewal attempt: it fails as if the proxy were unreachable (and is retried). */
  failedRenewalRate?: number;
  /** At each `lease.fetch` or `admit`: refused as a stale token (409), without sending. */
  tokenRefusalRate?: number;
  /** Seed of the generator (default: random); the same seed gives the same faults in order. */
  seed?: number;
}

/** A small seeded generator (mulberry32): enough for test faults, no dependency. */
export function seeded(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** The faults to inject, decided by one seeded generator. */
export class Faults {
  readonly random: () => number;
  constructor(private readonly mode: TestMode) {
    this.random = seeded(mode.seed ?? Math.floor(Math.random() * 2 ** 32));
  }

  private roll(rate: number | undefined): boolean {
    return rate !== undefined && rate > 0 && this.random() < rate;
  }

  loseNow(): boolean {
    return this.roll(this.mode.lossRate);
  }

  /** How much later to send the renewal due now (0: on time). */
  lateByMs(lifetimeMs: number): number {
    return this.roll(this.mode.lateRenewalRate) ? this.random() * lifetimeMs : 0;
  }

  failRenewal(): boolean {
    return this.roll(this.mode.failedRenewalRate);
  }

  refuseToken(): boolean {
    return this.roll(this.mode.tokenRefusalRate);
  }
}

/** The refusal an enforcer gives a stale token, as the test mode injects it. */
export function injectedRefusal(resource: string): ProblemError {
  return new ProblemError(409, {
    type: `${PROBLEM_BASE}stale-fencing-token`,
    title: "Conflict",
    status: 409,
    detail: `injected by the client's test mode: a newer holder of ${resource} has written`,
    injected: true,
  });
}

/** A stale-token refusal as the fence-gateway answers it, for `lease.fetch`. */
export function injectedRefusalResponse(resource: string): Response {
  const problem = injectedRefusal(resource).problem;
  return new Response(JSON.stringify(problem), {
    status: 409,
    headers: { "content-type": "application/problem+json", "fencing-rejection": "stale-fencing-token" },
  });
}
