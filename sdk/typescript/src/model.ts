/**
 * What the proxy answers, read in one place: each answer is decoded into a named shape or refused
 * with a ProtocolError, so no malformed field reaches a decision. And the timing rules every
 * guard shares (how long an answer grants, the renewal interval, the retry backoff).
 */

import { ProtocolError, isCount, isObject } from "./errors.js";

/** A successful acquire (201): the only answer that carries the secret. */
export interface Grant {
  resource: string;
  holder: string;
  /** The etcd lease id (decimal); the session id under a session. */
  leaseId: string;
  /** Proof of holding (`Lease-Secret`): renew, release and forward with it. */
  secret: string;
  /** The ownership key's etcd create revision: larger for every later holder. */
  token: bigint;
  /** The token signed for this resource, for `Fencing-Token`. */
  fencingToken: string;
  ttlSeconds: number;
  /** At least this long from when the request reached the proxy. */
  expiresInMs: number;
  session?: string;
  metadata?: Record<string, unknown>;
}

/** A successful renewal (200). */
export interface Renewal {
  ttlSeconds: number;
  expiresInMs: number;
  token: bigint;
}

/** A held resource as `GET /v1/leases/{resource}` and the listing show it (never a secret). */
export interface Holding {
  resource: string;
  holder: string;
  token: bigint;
  leaseId: string;
  ttlSeconds: number;
  expiresInMs: number;
  /** Wall-clock grant time, Unix milliseconds: for display only. */
  acquiredAt: number;
  session?: string;
  metadata?: Record<string, unknown>;
}

/** `POST /v1/sessions` (201), and a fleet member's join. */
export interface Opened {
  sessionId: string;
  holder: string;
  secret: string;
  ttlSeconds: number;
  expiresInMs: number;
}

/** What a keepalive (200) grants. */
export interface Heartbeat {
  ttlSeconds: number;
  expiresInMs: number;
}

/** One ownership event of `GET /v1/watch`. */
export interface LeaseEvent {
  /** The message id: resume after it. */
  id: string;
  type: "acquired" | "released" | "expired";
  resource: string;
  /** The holder of the grant that began or ended. */
  holder: string;
  /** That grant's token. */
  token: bigint;
  /** The etcd revision of the change. */
  revision: number;
  leaseId: string;
  session?: string;
}

/** Reads fields of one JSON object, throwing a ProtocolError naming `what` on the first bad one. */
export class Fields {
  private readonly body: Record<string, unknown>;
  constructor(
    body: unknown,
    private readonly what: string,
  ) {
    if (!isObject(body)) throw new ProtocolError(`${what}: not a JSON object`);
    this.body = body;
  }

  private fail(name: string, want: string): never {
    const got = JSON.stringify(this.body[name]) ?? "nothing";
    throw new ProtocolError(`${this.what}: field ${name} is not ${want} but ${got.slice(0, 100)}`);
  }

  string(name: string): string {
    const value = this.body[name];
    return typeof value === "string" ? value : this.fail(name, "a string");
  }

  optionalString(name: string): string | undefined {
    return this.body[name] === undefined || this.body[name] === null ? undefined : this.string(name);
  }

  /** A 64-bit number the API writes as a decimal string. */
  decimal(name: string): bigint {
    const value = this.body[name];
    if (typeof value === "string" && /^\d{1,20}$/.test(value) && BigInt(value) < 1n << 64n) return BigInt(value);
    return this.fail(name, "a decimal string");
  }

  count(name: string): number {
    const value = this.body[name];
    return isCount(value) ? value : this.fail(name, "a whole number ≥ 0");
  }

  optionalObject(name: string): Record<string, unknown> | undefined {
    const value = this.body[name];
    if (value === undefined || value === null) return undefined;
    return isObject(value) ? value : this.fail(name, "an object");
  }

  array(name: string): unknown[] {
    const value = this.body[name] ?? [];
    return Array.isArray(value) ? value : this.fail(name, "an array");
  }
}

export function parseGrant(body: unknown): Grant {
  const f = new Fields(body, "acquire answer");
  return {
    resource: f.string("resource"),
    holder: f.string("holder"),
    leaseId: f.string("lease_id"),
    secret: f.string("secret"),
    token: f.decimal("token"),
    fencingToken: f.string("fencing_token"),
    ttlSeconds: f.count("ttl_seconds"),
    expiresInMs: f.count("expires_in_ms"),
    session: f.optionalString("session"),
    metadata: f.optionalObject("metadata"),
  };
}

export function parseRenewal(body: unknown): Renewal {
  const f = new Fields(body, "renewal answer");
  return { ttlSeconds: f.count("ttl_seconds"), expiresInMs: f.count("expires_in_ms"), token: f.decimal("token") };
}

export function parseHolding(body: unknown): Holding {
  const f = new Fields(body, "holding");
  return {
    resource: f.string("resource"),
    holder: f.string("holder"),
    token: f.decimal("token"),
    leaseId: f.string("lease_id"),
    ttlSeconds: f.count("ttl_seconds"),
    expiresInMs: f.count("expires_in_ms"),
    acquiredAt: f.count("acquired_at"),
    session: f.optionalString("session"),
    metadata: f.optionalObject("metadata"),
  };
}

export function parsePage(body: unknown): { leases: Holding[]; nextCursor?: string } {
  const f = new Fields(body, "lease list");
  return { leases: f.array("leases").map(parseHolding), nextCursor: f.optionalString("next_cursor") };
}

export function parseOpened(body: unknown): Opened {
  const f = new Fields(body, "session answer");
  return {
    sessionId: f.string("session_id"),
    holder: f.string("holder"),
    secret: f.string("secret"),
    ttlSeconds: f.count("ttl_seconds"),
    expiresInMs: f.count("expires_in_ms"),
  };
}

export function parseHeartbeat(body: unknown): Heartbeat {
  const f = new Fields(body, "keepalive answer");
  return { ttlSeconds: f.count("ttl_seconds"), expiresInMs: f.count("expires_in_ms") };
}

const EVENT_TYPES = new Set(["acquired", "released", "expired"]);

/** The event in message `data` with id `id`. */
export function parseEvent(id: string, data: string): LeaseEvent {
  let body: unknown;
  try {
    body = JSON.parse(data);
  } catch {
    throw new ProtocolError(`watch event ${id}: not JSON: ${data.slice(0, 200)}`);
  }
  const f = new Fields(body, `watch event ${id}`);
  const type = f.string("type");
  if (!EVENT_TYPES.has(type)) throw new ProtocolError(`watch event ${id}: unknown type ${type.slice(0, 50)}`);
  return {
    id,
    type: type as LeaseEvent["type"],
    resource: f.string("resource"),
    holder: f.string("holder"),
    token: f.decimal("token"),
    revision: f.count("revision"),
    leaseId: f.string("lease_id"),
    session: f.optionalString("session"),
  };
}

/** The most time one answer may grant (2^31 s): beyond any real TTL, keeps every timer finite. */
export const MAX_LIFETIME_MS = 2 ** 31 * 1000;
/** The shortest pause between two renewals, whatever the answers say. */
export const MIN_RENEW_INTERVAL_MS = 100;

/**
 * How long an acquire, renewal or keepalive answer grants from the instant its request was sent:
 * its `expires_in_ms`, never more than its TTL plus `slackMs` (the wait of a queued acquire: the
 * proxy counts the TTL from the grant), nor MAX_LIFETIME_MS. 0 — lost — when `ttl_seconds` is 0.
 */
export function lifetimeMs(ttlSeconds: number, expiresInMs: number, slackMs = 0): number {
  if (ttlSeconds <= 0) return 0;
  return Math.min(expiresInMs, ttlSeconds * 1000 + slackMs, MAX_LIFETIME_MS);
}

/**
 * The safety margin taken off every deadline unless the client sets one: a tenth of the
 * lifetime, at least 100 ms (the Go SDK's rule too). It covers the client's clock running
 * slower than etcd's and the time work needs to notice an abort.
 */
export function defaultMarginMs(lifetime: number): number {
  return Math.max(lifetime / 10, 100);
}

/** The pause after a renewal granting `lifetime`: a third of it ±10 %, at least 100 ms. */
export function renewIntervalMs(lifetime: number, random: () => number): number {
  return Math.max((lifetime / 3) * (0.9 + 0.2 * random()), MIN_RENEW_INTERVAL_MS);
}

/** The pause before retry `attempt` (0-based) of a failed renewal: 100 ms doubling to 1 s. */
export function retryBackoffMs(attempt: number): number {
  return Math.min(100 * 2 ** attempt, 1000);
}
