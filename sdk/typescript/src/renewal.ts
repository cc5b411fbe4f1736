/**
 * The background renewal of a grant or a session: at a third of the lifetime last granted
 * (±10 %), failures other than a 410 retried with a short backoff, every success moving the
 * stop-by deadline on from the instant read before its request was sent.
 */

import { LostError, ProblemError, SessionLostError, TransportError } from "./errors.js";
import type { Liveness } from "./liveness.js";
import { lifetimeMs, renewIntervalMs, retryBackoffMs } from "./model.js";
import type { Faults } from "./testmode.js";

/** What one renewal (or keepalive) answered. */
export interface Renewed {
  ttlSeconds: number;
  expiresInMs: number;
  /** The grant's token, when the answer names one: it must be the lease's own. */
  token?: bigint;
}

/** What is kept alive. */
export interface RenewTarget {
  /** One renewal; throws LostError or SessionLostError on a 410. */
  renew(signal: AbortSignal): Promise<Renewed>;
  /** Ends it on the server (after an injected loss). */
  release(): Promise<void>;
  /** The token renewals must answer with, for a grant. */
  token?: bigint;
}

/** How the deadline is computed from a lifetime: the safety margin to take off. */
export type Margin = (lifetimeMs: number) => number;

/** Sleeps `ms`, or less when `signal` aborts. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve();
    const done = () => {
      clearTimeout(timer);
      signal?.removeEventListener("abort", done);
      resolve();
    };
    const timer = setTimeout(done, Math.max(0, ms));
    signal?.addEventListener("abort", done, { once: true });
  });
}

/**
 * Whether a renewal's failure means it will never succeed: a 410, or any other 4xx but 408 and
 * 429 (403 another principal's, 401 a withdrawn token…). Anything else — transport, 5xx, a
 * malformed answer — may pass, and is retried until the deadline.
 */
export function refused(e: unknown): boolean {
  if (e instanceof LostError || e instanceof SessionLostError) return true;
  return e instanceof ProblemError && e.status >= 400 && e.status < 500 && e.status !== 408 && e.status !== 429;
}

/** Keeps one grant or session alive until stopped or lost. */
export class Keeper {
  private readonly stopper = new AbortController();
  private paused = false;

  constructor(
    private readonly liveness: Liveness,
    private readonly target: RenewTarget,
    private readonly margin: Margin,
    private readonly random: () => number,
    private readonly faults?: Faults,
  ) {}

  /** Starts renewing: `sentAt` is when the granting request was sent, `lifetime` what it granted. */
  start(sentAt: number, lifetime: number): void {
    if (this.liveness.check()) return;
    void this.run(sentAt, lifetime);
  }

  /** Stops renewing (release, close). */
  stop(): void {
    this.stopper.abort();
  }

  /** Test hook: skip (`true`) or send again (`false`) the renewals, as if the process were stopped. */
  pause(paused: boolean): void {
    this.paused = paused;
  }

  private get done(): boolean {
    return this.stopper.signal.aborted || this.liveness.check();
  }

  private async run(sentAt: number, lifetime: number): Promise<void> {
    let last = sentAt;
    let granted = lifetime;
    while (!this.done) {
      await sleep(last + renewIntervalMs(granted, this.random) - performance.now(), this.stopper.signal);
      if (this.done) return;
      if (this.paused) {
        last = performance.now();
        continue;
      }
      if (this.faults?.loseNow()) {
        this.liveness.lose("revoked", "lost on purpose by the client's test mode", true);
        this.target.release().catch(() => {});
        return;
      }
      const late = this.faults?.lateByMs(granted) ?? 0;
      if (late > 0) await sleep(late, this.stopper.signal);
      const renewed = await this.renewOnce();
      if (renewed === undefined) return;
      [last, granted] = renewed;
    }
  }

  /** Renews, retrying until it succeeds (its send instant and lifetime) or it is lost or stopped. */
  private async renewOnce(): Promise<[number, number] | undefined> {
    for (let attempt = 0; !this.done; attempt++) {
      const sentAt = performance.now();
      try {
        if (this.faults?.failRenewal()) throw new TransportError("renewal failed on purpose (test mode)");
        const answer = await this.target.renew(this.stopper.signal);
        return this.granted(sentAt, answer);
      } catch (e) {
        if (refused(e)) {
          this.liveness.lose("revoked", `the renewal was refused: ${(e as Error).message}`);
          return undefined;
        }
        await sleep(retryBackoffMs(attempt), this.stopper.signal);
      }
    }
    return undefined;
  }

  /** Takes in a successful renewal; undefined when it means the lease is lost. */
  private granted(sentAt: number, answer: Renewed): [number, number] | undefined {
    if (this.target.token !== undefined && answer.token !== undefined && answer.token !== this.target.token) {
      this.liveness.lose("revoked", `the renewal answered for another grant (token ${answer.token}, ours ${this.target.token})`);
      return undefined;
    }
    const lifetime = lifetimeMs(answer.ttlSeconds, answer.expiresInMs);
    const stopBy = sentAt + lifetime - this.margin(lifetime);
    if (lifetime === 0 || stopBy <= performance.now()) {
      this.liveness.lose("expired", `the renewal granted no time (ttl_seconds ${answer.ttlSeconds})`);
      return undefined;
    }
    this.liveness.extend(stopBy);
    return [sentAt, lifetime];
  }
}
