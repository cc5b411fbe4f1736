/**
 * The client: its options, the one-shot calls of the API, and the guards (`acquire`, `using`,
 * `openSession`) built on them.
 */

import { ConfigError, ProblemError, ProtocolError, isTransient } from "./errors.js";
import { SECRET_HEADER, Transport, segment, type TransportOptions } from "./http.js";
import { Lease } from "./lease.js";
import { Liveness } from "./liveness.js";
import { LossWatch } from "./losswatch.js";
import {
  defaultMarginMs,
  lifetimeMs,
  parseGrant,
  parseHeartbeat,
  parseHolding,
  parseOpened,
  parsePage,
  parseRenewal,
  type Grant,
  type Holding,
  type Renewal,
} from "./model.js";
import { Keeper, sleep, type RenewTarget } from "./renewal.js";
import { Session } from "./session.js";
import { Faults, type TestMode } from "./testmode.js";
import { EventStream, type WatchOptions } from "./watch.js";
import { deleteFleet, drainMember, evictMember, getFleet, join, putFleet, type FleetMember, type FleetSpec, type FleetView, type JoinOptions } from "./fleet.js";

/** How a client talks to the proxy and keeps its leases. */
export interface ClientOptions extends TransportOptions {
  /**
   * Taken off every deadline: the stop-by deadline is the instant read before sending the
   * request that succeeded + the lifetime it granted − this. Default: a tenth of the lifetime,
   * at most 2 s.
   */
  safetyMarginMs?: number;
  /** Open one `/v1/watch` stream while leases are held, to learn of a loss at once (default true). */
  watchLoss?: boolean;
  /** Inject faults (lease loss, late and failed renewals, token refusals) at set rates: for tests. */
  testMode?: TestMode;
  /** The holder named when an acquire (or a session) names none. */
  holder?: string;
}

/** How to acquire a resource. */
export interface AcquireOptions {
  /** Who asks (free text; shown to others in conflicts and listings); the client's `holder` by default. */
  holder?: string;
  /** The lease's time to live, whole seconds. */
  ttlSeconds: number;
  /** Wait up to this long (server-side, first come first served) for a held resource. */
  waitMs?: number;
  /** Makes a retried acquire return the same grant (and retries on transport errors); unguessable. */
  idempotencyKey?: string;
  /** A JSON object stored with the grant. */
  metadata?: Record<string, unknown>;
  /** Gives up (waiting) when aborted. */
  signal?: AbortSignal;
}

/** What an acquire sends, with or without a session. */
interface GrantRequest {
  holder?: string;
  ttlSeconds?: number;
  waitMs?: number;
  idempotencyKey?: string;
  metadata?: Record<string, unknown>;
  signal?: AbortSignal;
  session?: { id: string; secret: string };
}

/** Attempts of an acquire with an `Idempotency-Key` that fails transiently. */
const IDEMPOTENT_ATTEMPTS = 4;

/** What the guards share of their client. @internal */
export interface Internals {
  transport: Transport;
  faults?: Faults;
  grant(resource: string, request: GrantRequest): Promise<{ grant: Grant; sentAt: number }>;
  watchLoss(resource: string, token: bigint, liveness: Liveness): void;
  keeper(liveness: Liveness, target: RenewTarget): Keeper;
  margin(lifetime: number): number;
}

/** A lease-proxy client. One per process is enough: its leases share one event stream. */
export class Client {
  private readonly transport: Transport;
  private readonly faults: Faults | undefined;
  private readonly lossWatch: LossWatch | undefined;
  private readonly internals: Internals;
  /** The leases and sessions this client holds, for close(). */
  private readonly guards = new Set<{ release(): Promise<void> } | { close(): Promise<void> }>();

  /** A client of the proxy at `baseUrl` (`http://127.0.0.1:7070`); throws ConfigError for a bad URL. */
  constructor(baseUrl: string, private readonly options: ClientOptions = {}) {
    this.transport = new Transport(baseUrl, options);
    this.faults = options.testMode ? new Faults(options.testMode) : undefined;
    this.lossWatch = options.watchLoss === false ? undefined : new LossWatch(this.transport);
    this.internals = {
      transport: this.transport,
      faults: this.faults,
      grant: (resource, request) => this.grantSent(resource, request),
      watchLoss: (resource, token, liveness) => this.lossWatch?.add(resource, token, liveness),
      keeper: (liveness, target) => new Keeper(liveness, target, (l) => this.margin(l), this.random, this.faults),
      margin: (l) => this.margin(l),
    };
  }

  private get random(): () => number {
    return this.faults?.random ?? Math.random;
  }

  private margin(lifetime: number): number {
    return this.options.safetyMarginMs ?? defaultMarginMs(lifetime);
  }

  /**
   * Acquires `resource` and returns a Lease that keeps it. Its stop-by deadline counts from the
   * instant read just before sending the request that succeeded. An answer granting no time
   * gives a lease already lost (`expired`), not renewed. HeldError when held (without `waitMs`,
   * or still held when the wait ended).
   */
  async acquire(resource: string, options: AcquireOptions): Promise<Lease> {
    const { grant, sentAt } = await this.grantSent(resource, options);
    const lifetime = lifetimeMs(grant.ttlSeconds, grant.expiresInMs, options.waitMs ?? 0);
    const liveness = new Liveness(grant.resource, sentAt + lifetime - this.margin(lifetime));
    const keeper = this.internals.keeper(liveness, {
      token: grant.token,
      renew: (signal) => this.renew(grant.resource, grant.secret, signal),
      release: () => this.release(grant.resource, grant.secret),
    });
    if (lifetime === 0) liveness.lose("expired", `the acquire granted no time (ttl_seconds ${grant.ttlSeconds})`);
    this.lossWatch?.add(grant.resource, grant.token, liveness);
    keeper.start(sentAt, lifetime);
    return this.track(new Lease(this.internals, grant, liveness, keeper), liveness);
  }

  /** Keeps `guard` for close() until it is lost. */
  private track<G extends { release(): Promise<void> } | { close(): Promise<void> }>(guard: G, liveness: Liveness): G {
    this.guards.add(guard);
    liveness.signal.addEventListener("abort", () => this.guards.delete(guard), { once: true });
    return guard;
  }

  /**
   * Releases every lease and closes every session this client still holds (their signals are
   * aborted, `released`), and closes its event stream. The client can be used again afterwards.
   */
  async close(): Promise<void> {
    const guards = [...this.guards];
    this.guards.clear();
    await Promise.allSettled(guards.map((g) => ("release" in g ? g.release() : g.close())));
    this.lossWatch?.stop();
  }

  /**
   * Runs `work` holding `resource`: acquired first, kept alive exactly as long as `work` runs,
   * released after it whatever happens. `signal` is the lease's: aborted on loss, so pass it to
   * what `work` awaits. Resolves with what `work` resolved with — unless the lease was lost
   * before it finished: then rejects with the LostError, whatever `work` did, since what it did
   * after the loss was not done under the lease.
   */
  async using<T>(resource: string, options: AcquireOptions, work: (lease: Lease, signal: AbortSignal) => Promise<T>): Promise<T> {
    const lease = await this.acquire(resource, options);
    try {
      lease.throwIfLost();
      const result = await work(lease, lease.signal);
      lease.throwIfLost();
      return result;
    } catch (e) {
      throw lease.lostReason ?? e;
    } finally {
      await lease.release().catch(() => {});
    }
  }

  /** Opens a session of `ttlSeconds` for `holder`, kept alive by one heartbeat. */
  async openSession(options: { holder?: string; ttlSeconds: number; signal?: AbortSignal }): Promise<Session> {
    const holder = options.holder ?? this.options.holder;
    if (holder === undefined) throw new ConfigError("no holder: name one in openSession or the client's options");
    const sentAt = performance.now();
    const opened = parseOpened(
      await this.transport.call({
        method: "POST",
        path: "/v1/sessions",
        json: { holder, ttl_seconds: options.ttlSeconds },
        signal: options.signal,
      }),
    );
    return this.keepSession(opened, sentAt, opened.sessionId);
  }

  /** @internal A guard for an opened session (also a fleet member's). */
  keepSession(opened: { sessionId: string; secret: string; holder: string; ttlSeconds: number; expiresInMs: number }, sentAt: number, name: string): Session {
    const lifetime = lifetimeMs(opened.ttlSeconds, opened.expiresInMs);
    const liveness = new Liveness(name, sentAt + lifetime - this.margin(lifetime));
    if (lifetime === 0) liveness.lose("expired", "the session was opened with no time");
    const keeper = this.internals.keeper(liveness, {
      renew: (signal) => this.keepalive(opened.sessionId, opened.secret, signal),
      release: () => this.closeSession(opened.sessionId, opened.secret),
    });
    keeper.start(sentAt, lifetime);
    return this.track(new Session(this.internals, opened, liveness, keeper), liveness);
  }

  /** Joins `fleet` as a member (a session kept alive here); see FleetMember. */
  async joinFleet(fleet: string, options: JoinOptions): Promise<FleetMember> {
    return join(this.internals, (opened, sentAt, name) => this.keepSession(opened, sentAt, name), fleet, options);
  }

  /** Creates or changes `fleet` (`PUT /v1/fleets/{fleet}`); its revision. */
  async putFleet(fleet: string, spec: FleetSpec): Promise<bigint> {
    return putFleet(this.internals, fleet, spec);
  }

  /** Ends `fleet`: every grant it made is released before it resolves. */
  async deleteFleet(fleet: string): Promise<void> {
    return deleteFleet(this.internals, fleet);
  }

  /** `fleet` as it stands, without secrets; undefined when there is none. */
  async getFleet(fleet: string): Promise<FleetView | undefined> {
    return getFleet(this.internals, fleet);
  }

  /**
   * Drains `member` of `fleet` (an operator's call, no secret): it hands everything off and takes
   * nothing new; a member with nobody to hand off to keeps what it holds.
   */
  async drainMember(fleet: string, member: string): Promise<void> {
    return drainMember(this.internals, fleet, member);
  }

  /** Evicts `member` from `fleet` (an operator's call): its grants end at once, it gets nothing until it joins again. */
  async evictMember(fleet: string, member: string): Promise<void> {
    return evictMember(this.internals, fleet, member);
  }

  /** The ownership events of resources starting with `prefix`, as an async iterator (see EventStream). */
  watch(options: WatchOptions = {}): EventStream {
    return new EventStream(this.transport, options);
  }

  /** Acquires `resource` once, without renewing it: yours to renew and release. */
  async grant(resource: string, options: AcquireOptions): Promise<Grant> {
    return (await this.grantSent(resource, options)).grant;
  }

  /** `POST /v1/leases/{resource}`, retried with its idempotency key; and when it was sent. */
  private async grantSent(resource: string, request: GrantRequest): Promise<{ grant: Grant; sentAt: number }> {
    const holder = request.holder ?? this.options.holder;
    if (holder === undefined) throw new ConfigError("no holder: name one in the acquire or the client's options");
    const body: Record<string, unknown> = { holder };
    if (request.ttlSeconds !== undefined) body.ttl_seconds = request.ttlSeconds;
    if (request.waitMs !== undefined) body.wait_ms = request.waitMs;
    if (request.metadata !== undefined) body.metadata = request.metadata;
    if (request.session !== undefined) body.session = request.session.id;
    const headers: Record<string, string> = {};
    if (request.idempotencyKey !== undefined) headers["idempotency-key"] = request.idempotencyKey;
    if (request.session !== undefined) headers[SECRET_HEADER] = request.session.secret;
    for (let attempt = 1; ; attempt++) {
      const sentAt = performance.now();
      try {
        const answer = await this.transport.call({
          method: "POST",
          path: `/v1/leases/${segment(resource)}`,
          headers,
          json: body,
          extraTimeoutMs: request.waitMs ?? 0,
          signal: request.signal,
        });
        const grant = parseGrant(answer);
        if (grant.resource !== resource) {
          throw new ProtocolError(`acquire of ${resource} answered with a grant of ${grant.resource}`);
        }
        if (grant.fencingToken.split(".")[3] !== grant.token.toString()) {
          throw new ProtocolError(`acquire of ${resource}: the fencing token carries another revision than ${grant.token}`);
        }
        return { grant, sentAt };
      } catch (e) {
        if (!isTransient(e) || request.idempotencyKey === undefined || attempt >= IDEMPOTENT_ATTEMPTS) throw e;
        await sleep(100 * 2 ** (attempt - 1), request.signal);
      }
    }
  }

  /** Renews the grant of `resource` proven by `secret` once; LostError when it has ended. */
  async renew(resource: string, secret: string, signal?: AbortSignal): Promise<Renewal> {
    return parseRenewal(
      await this.transport.call({
        method: "POST",
        path: `/v1/leases/${segment(resource)}/renew`,
        headers: { [SECRET_HEADER]: secret },
        signal,
      }),
    );
  }

  /** Releases the grant of `resource` proven by `secret`. Idempotent. */
  async release(resource: string, secret: string): Promise<void> {
    await this.transport.call({ method: "DELETE", path: `/v1/leases/${segment(resource)}`, headers: { [SECRET_HEADER]: secret } });
  }

  /** Who holds `resource`, or undefined when it is free. */
  async get(resource: string): Promise<Holding | undefined> {
    try {
      return parseHolding(await this.transport.call({ method: "GET", path: `/v1/leases/${segment(resource)}` }));
    } catch (e) {
      if (e instanceof ProblemError && e.slug === "not-found") return undefined;
      throw e;
    }
  }

  /** Every held resource whose name starts with `prefix`, in name order (all pages). */
  async list(prefix = ""): Promise<Holding[]> {
    const all: Holding[] = [];
    let cursor: string | undefined;
    do {
      const query: Record<string, string> = { prefix, limit: "1000" };
      if (cursor !== undefined) query.cursor = cursor;
      const page = parsePage(await this.transport.call({ method: "GET", path: "/v1/leases", query }));
      all.push(...page.leases);
      cursor = page.nextCursor;
    } while (cursor !== undefined);
    return all;
  }

  /** `POST /v1/sessions/{id}/keepalive`. */
  private async keepalive(id: string, secret: string, signal: AbortSignal) {
    const path = `/v1/sessions/${segment(id)}/keepalive`;
    return parseHeartbeat(await this.transport.call({ method: "POST", path, headers: { [SECRET_HEADER]: secret }, signal }));
  }

  /** `DELETE /v1/sessions/{id}` (idempotent). */
  private async closeSession(id: string, secret: string): Promise<void> {
    await this.transport.call({ method: "DELETE", path: `/v1/sessions/${segment(id)}`, headers: { [SECRET_HEADER]: secret } });
  }
}
