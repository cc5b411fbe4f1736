/**
 * Whether a lease (or a session) is still held: its stop-by deadline on the monotonic clock
 * (`performance.now()`), the AbortSignal aborted on loss, and why it was lost.
 */

import { LostError, type LostReason } from "./errors.js";

/** setTimeout's longest delay; longer waits are re-armed. */
const MAX_TIMER_MS = 2 ** 31 - 1;

/** The state of one lease or session. Lost once, for the first reason, for good. */
export class Liveness {
  private readonly controller = new AbortController();
  private stopBy: number;
  private timer: ReturnType<typeof setTimeout> | undefined;
  private settle!: (error: LostError) => void;
  /** Resolves with the LostError once lost; never rejects. */
  readonly lost: Promise<LostError>;

  /**
   * Held until `stopBy` (a `performance.now()` reading) unless extended; under `parent` (a
   * session) the deadline is the parent's and its loss is this one's (`session-lost`).
   */
  constructor(
    readonly resource: string,
    stopBy: number,
    private readonly parent?: Liveness,
  ) {
    this.stopBy = stopBy;
    this.lost = new Promise((resolve) => (this.settle = resolve));
    if (parent !== undefined) {
      const follow = () => this.lose("session-lost", `the session was lost (${(parent.reason as LostError).reason})`);
      if (parent.signal.aborted) follow();
      else {
        // Detached once this one is lost: a session outliving many of its leases (a fleet
        // member's) keeps no listener per lease.
        parent.signal.addEventListener("abort", follow, { once: true });
        this.controller.signal.addEventListener("abort", () => parent.signal.removeEventListener("abort", follow), { once: true });
      }
    } else {
      this.arm();
    }
  }

  /** The stop-by deadline on `performance.now()`'s clock. */
  get deadline(): number {
    return this.parent !== undefined ? this.parent.deadline : this.stopBy;
  }

  /** Aborted when lost; its `reason` is the LostError. Reads the clock first. */
  get signal(): AbortSignal {
    this.check();
    return this.controller.signal;
  }

  /** The LostError once lost (reads the clock), else undefined. */
  get reason(): LostError | undefined {
    return this.check() ? (this.controller.signal.reason as LostError) : undefined;
  }

  /**
   * Whether it is lost, reading the clock: past the deadline it is lost now, even if the
   * deadline timer has not run yet (a process resumed after being stopped, a busy event loop).
   */
  check(): boolean {
    if (this.controller.signal.aborted) return true;
    if (this.parent !== undefined) this.parent.check();
    else if (performance.now() >= this.stopBy) this.expire();
    return this.controller.signal.aborted;
  }

  /** Moves the deadline to `stopBy` when that is later and it is not lost. */
  extend(stopBy: number): void {
    if (stopBy > this.stopBy && !this.check()) this.stopBy = stopBy;
  }

  /** Marks it lost for `reason`, unless it already was (the first reason stays). */
  lose(reason: LostReason, detail: string, injected = false, event?: LostError["event"]): LostError {
    if (!this.controller.signal.aborted) {
      const error = new LostError(reason, this.resource, detail, injected, event);
      clearTimeout(this.timer);
      this.controller.abort(error);
      this.settle(error);
    }
    return this.controller.signal.reason as LostError;
  }

  private expire(): void {
    const late = performance.now() - this.stopBy;
    this.lose("expired", `the stop-by deadline passed ${late.toFixed(0)} ms ago without a successful renewal`);
  }

  /** The deadline timer: fires at the deadline, re-arms when the deadline moved on. */
  private arm(): void {
    const wait = Math.min(Math.max(this.stopBy - performance.now(), 0), MAX_TIMER_MS);
    this.timer = setTimeout(() => {
      if (!this.check()) this.arm();
    }, wait);
  }
}
