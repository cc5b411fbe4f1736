/**
 * The lease guard: a grant kept alive in the background, its AbortSignal aborted on loss, the
 * token propagated to `fetch`, release (explicit, `await using`, or by `client.using`).
 */

import { LostError, PROBLEM_BASE, isObject, type LostReason } from "./errors.js";
import { SECRET_HEADER, segment, type Transport } from "./http.js";
import type { Liveness } from "./liveness.js";
import type { Grant } from "./model.js";
import type { Keeper } from "./renewal.js";
import { link } from "./signals.js";
import { injectedRefusalResponse, type Faults } from "./testmode.js";

/** What a lease needs of its client. */
export interface LeaseContext {
  transport: Transport;
  faults?: Faults;
}

/**
 * A held resource. Renews itself (at a third of the lifetime granted, ±10 %) and is lost — its
 * `signal` aborted with a LostError as reason, `lost` resolved — no later than its stop-by
 * deadline, at once when the proxy refuses a renewal (410) or reports the grant ended or
 * replaced on its event stream. Pass `signal` to the work it protects and present
 * `fencingToken` to the storage (`lease.fetch` does), so a write made after a loss anyway is
 * refused there.
 */
export class Lease {
  private released = false;
  private handOffBy: number | undefined;

  /** @internal Made by `Client.acquire`, `Session.acquire` and a fleet member. */
  constructor(
    private readonly context: LeaseContext,
    /** The grant as the proxy answered it (the secret included). */
    readonly grant: Grant,
    private readonly liveness: Liveness,
    private readonly keeper?: Keeper,
    /**
     * A fleet's lease: whether its member still holds this grant. The session's secret proves
     * every grant under the session, so a late release of a grant already taken back could
     * end a later grant of the same resource to the same member: it is not sent then.
     */
    private readonly stillHeld?: () => boolean,
  ) {}

  /** The resource held. */
  get resource(): string {
    return this.grant.resource;
  }

  /** The holder named in the grant. */
  get holder(): string {
    return this.grant.holder;
  }

  /** The etcd lease id (decimal; the session id under a session). */
  get leaseId(): string {
    return this.grant.leaseId;
  }

  /** The fencing token's revision: larger for every later grant of the resource. */
  get token(): bigint {
    return this.grant.token;
  }

  /** The signed fencing token, for the `Fencing-Token` header of writes to protected storage. */
  get fencingToken(): string {
    return this.grant.fencingToken;
  }

  /** The grant's secret (`Lease-Secret`). */
  get secret(): string {
    return this.grant.secret;
  }

  /** Aborted when the lease is lost; `signal.reason` is the LostError. Reads the clock first. */
  get signal(): AbortSignal {
    return this.liveness.signal;
  }

  /** Resolves with the LostError once the lease is lost; never rejects. */
  get lost(): Promise<LostError> {
    return this.liveness.lost;
  }

  /** Why it was lost, or undefined while held. Reads the clock. */
  get lostReason(): LostError | undefined {
    return this.liveness.reason;
  }

  /**
   * The stop-by deadline on `performance.now()`'s clock: held at least until then unless lost
   * earlier; moved on by every successful renewal.
   */
  get stopBy(): number {
    return this.liveness.deadline;
  }

  /** Whether it is lost. Reads the clock: past the deadline this is true even if no timer has run. */
  isLost(): boolean {
    return this.liveness.check();
  }

  /** Throws the LostError if the lease is lost (reads the clock): call it before each protected step. */
  throwIfLost(): void {
    const reason = this.liveness.reason;
    if (reason !== undefined) throw reason;
  }

  /**
   * `fetch` with this lease's `Fencing-Token` and `Fencing-Resource` set (for fence-gateway in
   * front of the storage), aborted (as by `init.signal`) when the lease is lost before the
   * answer's headers have arrived — the request, its body included, was sent and answered under
   * the lease; the answer's body is the caller's. Throws the LostError without sending once it
   * is lost.
   */
  async fetch(input: string | URL | Request, init: RequestInit = {}): Promise<Response> {
    this.throwIfLost();
    if (this.context.faults?.refuseToken()) return injectedRefusalResponse(this.resource);
    const headers = new Headers(init.headers ?? (input instanceof Request ? input.headers : undefined));
    headers.set("fencing-token", this.fencingToken);
    headers.set("fencing-resource", this.resource);
    // A link of its own per request, detached once answered: a lease that makes request after
    // request keeps no listener per request (undici's own stays on the link's signal).
    const linked = link(init.signal ?? undefined, this.signal);
    try {
      return await fetch(input, { ...init, headers, signal: linked.signal });
    } finally {
      linked.dispose();
    }
  }

  /**
   * Sends a request through the proxy's forward route to its `--upstream`, which receives it
   * with this grant's fencing token. A 410 `lease-lost` from the proxy loses the lease and
   * throws its LostError; any other answer is the upstream's, whatever its status.
   */
  async forward(method: string, path: string, init: RequestInit = {}): Promise<Response> {
    this.throwIfLost();
    const t = this.context.transport;
    const headers = new Headers(init.headers);
    headers.set(SECRET_HEADER, this.secret);
    const url = t.url(`/v1/leases/${segment(this.resource)}/forward/${path.replace(/^\/+/, "")}`);
    // Detached from the lease's signal by its timeout at the latest: the body is the caller's.
    const { response } = await t.send(url, { ...init, method, headers }, AbortSignal.timeout(t.timeoutMs), this.signal);
    if (response.status === 410 && (await isLeaseLost(response))) {
      throw this.liveness.lose("revoked", "the proxy answered the forward 410 lease-lost");
    }
    return response;
  }

  /** Stops renewing, marks the lease lost (`released`) and releases it. Idempotent. */
  async release(): Promise<void> {
    this.keeper?.stop();
    this.liveness.lose("released", "released by this client");
    if (this.released) return;
    this.released = true;
    if (this.stillHeld !== undefined && !this.stillHeld()) return;
    await this.context.transport.call({
      method: "DELETE",
      path: `/v1/leases/${segment(this.resource)}`,
      headers: { [SECRET_HEADER]: this.secret },
    });
  }

  /** `await using lease = await client.acquire(…)` releases it at the end of the block. */
  async [Symbol.asyncDispose](): Promise<void> {
    await this.release();
  }

  /** @internal Marks it lost for `reason` (a fleet's grant taken back). */
  markLost(reason: LostReason, detail: string): void {
    this.liveness.lose(reason, detail);
  }

  /**
   * For a fleet lease moved to another member (lost `handed-off`): when its work must be done
   * and the resource released, in `performance.now()` milliseconds (the monotonic clock) — the
   * assignment's arrival plus the service's `deadline_ms`, less a safety margin (a tenth of it,
   * at least 100 ms); past the service's deadline it revokes the grant. Undefined for any other
   * lease, and before the hand-off.
   */
  get releaseBy(): number | undefined {
    return this.handOffBy;
  }

  /** @internal A fleet's hand-off, to be released by `by` (set before the signal aborts). */
  markHandedOff(by: number, detail: string): void {
    this.handOffBy ??= by;
    this.liveness.lose("handed-off", detail);
  }

  /** Test hook: stop (`true`) or resume (`false`) sending renewals; the deadline still runs. */
  pauseRenewals(paused: boolean): void {
    this.keeper?.pause(paused);
  }
}

/** Whether a 410 is the proxy's `lease-lost` problem (not an upstream's own 410). */
async function isLeaseLost(response: Response): Promise<boolean> {
  if (!(response.headers.get("content-type") ?? "").includes("problem+json")) return false;
  try {
    const body: unknown = await response.clone().json();
    return isObject(body) && body.type === `${PROBLEM_BASE}lease-lost`;
  } catch {
    return false;
  }
}
