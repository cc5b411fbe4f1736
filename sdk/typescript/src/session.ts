/**
 * Sessions: one etcd lease kept alive by one heartbeat, holding any number of resources. A
 * lease acquired under a session has the session's deadline and is lost when the session is.
 */

import { SessionLostError, type LostError } from "./errors.js";
import { SECRET_HEADER, segment } from "./http.js";
import { Lease } from "./lease.js";
import { Liveness } from "./liveness.js";
import type { Opened } from "./model.js";
import type { Keeper } from "./renewal.js";
import type { Internals } from "./client.js";

/** How to acquire under a session: its TTL is the session's. */
export interface SessionAcquireOptions {
  /** Who asks; the session's holder by default. */
  holder?: string;
  /** Wait up to this long (server-side, first come first served) for a held resource. */
  waitMs?: number;
  /** Makes a retried acquire return the same grant; use an unguessable value. */
  idempotencyKey?: string;
  /** A JSON object stored with the grant. */
  metadata?: Record<string, unknown>;
  /** Gives up waiting when aborted. */
  signal?: AbortSignal;
}

/** An open session, kept alive in the background. Its leases need no renewal of their own. */
export class Session {
  private closed = false;

  /** @internal Made by `Client.openSession` (and a fleet's join). */
  constructor(
    private readonly internals: Internals,
    /** The session as the proxy answered it. */
    readonly opened: Opened,
    /** @internal */
    readonly liveness: Liveness,
    private readonly keeper: Keeper,
  ) {}

  /** The session id. */
  get id(): string {
    return this.opened.sessionId;
  }

  /** The session's holder. */
  get holder(): string {
    return this.opened.holder;
  }

  /** Aborted when the session is lost (every lease under it with it). */
  get signal(): AbortSignal {
    return this.liveness.signal;
  }

  /** Resolves with the LostError once the session is lost. */
  get lost(): Promise<LostError> {
    return this.liveness.lost;
  }

  /** The stop-by deadline of the session and its leases, on `performance.now()`'s clock. */
  get stopBy(): number {
    return this.liveness.deadline;
  }

  /** Whether the session is lost (reads the clock). */
  isLost(): boolean {
    return this.liveness.check();
  }

  /** Acquires `resource` under this session: one transaction, no lease of its own. */
  async acquire(resource: string, options: SessionAcquireOptions = {}): Promise<Lease> {
    const reason = this.liveness.reason;
    if (reason !== undefined) throw reason;
    try {
      const { grant } = await this.internals.grant(resource, {
        holder: options.holder ?? this.holder,
        waitMs: options.waitMs,
        idempotencyKey: options.idempotencyKey,
        metadata: options.metadata,
        signal: options.signal,
        session: { id: this.id, secret: this.opened.secret },
      });
      const liveness = new Liveness(grant.resource, 0, this.liveness);
      this.internals.watchLoss(grant.resource, grant.token, liveness);
      return new Lease(this.internals, grant, liveness);
    } catch (e) {
      if (e instanceof SessionLostError) this.liveness.lose("revoked", `acquire under the session: ${e.message}`);
      throw e;
    }
  }

  /** Stops the heartbeat, marks the session (and its leases) lost and closes it. Idempotent. */
  async close(): Promise<void> {
    this.keeper.stop();
    this.liveness.lose("released", "the session was closed by this client");
    if (this.closed) return;
    this.closed = true;
    await this.internals.transport.call({
      method: "DELETE",
      path: `/v1/sessions/${segment(this.id)}`,
      headers: { [SECRET_HEADER]: this.opened.secret },
    });
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }

  /** Test hook: stop (`true`) or resume (`false`) the heartbeat; the deadline still runs. */
  pauseKeepalives(paused: boolean): void {
    this.keeper.pause(paused);
  }
}
