/**
 * Every error the client throws, and how an answer of the proxy becomes one: written once, here.
 */

/** Every problem type URI of the proxy (and of fence-gateway) starts with this. */
export const PROBLEM_BASE = "https://lease-proxy.dev/problems/";

/** Why a lease (or a session) stopped being held. */
export type LostReason =
  /** The stop-by deadline passed without a successful renewal. */
  | "expired"
  /** The server said so: a 410, or its event stream reported the grant ended or replaced. */
  | "revoked"
  /** The session the lease lives on was lost. */
  | "session-lost"
  /** Released (or its session closed) by this client. */
  | "released"
  /** A fleet moved it to another member: stop, then release it. */
  | "handed-off";

/** The root of every error this package throws. */
export class LeaseProxyError extends Error {
  override name = "LeaseProxyError";
}

/** 409 `lease-held`: someone else holds the resource. */
export class HeldError extends LeaseProxyError {
  override name = "HeldError";
  constructor(
    /** Who holds it. */
    readonly holder: string,
    /** The holder's token (its grant's create revision). */
    readonly token: bigint,
    /** How long the holder's lease may still last, as etcd reported it. */
    readonly expiresInMs: number,
    /** The `Retry-After` seconds the proxy suggested, if any. */
    readonly retryAfterSeconds: number | undefined,
  ) {
    super(`held by ${holder} (token ${token}) for up to ${expiresInMs} ms more`);
  }
}

/**
 * The lease is no longer held. The `reason` of a lease's `signal` once aborted, what `lease.lost`
 * resolves to, and what the lease's calls throw afterwards (410 `lease-lost` too).
 */
export class LostError extends LeaseProxyError {
  override name = "LostError";
  constructor(
    /** Why. */
    readonly reason: LostReason,
    /** The resource (empty when the proxy's 410 did not say). */
    readonly resource: string,
    /** What happened, for a human. */
    detail: string,
    /** Set when the loss was injected by the client's test mode. */
    readonly injected = false,
    /** The proxy's event that reported it, when that is how the client learnt it. */
    readonly event?: { type: string; resource: string; holder: string; token: bigint; revision: number },
  ) {
    super(`${resource ? `lease on ${resource}` : "lease"} lost (${reason}): ${detail}`);
  }
}

/** 410 `session-lost`: the session was closed, lapsed or never existed. */
export class SessionLostError extends LeaseProxyError {
  override name = "SessionLostError";
}

/** 410 `events-compacted`: a watch's resume point left etcd's history; list, then watch anew. */
export class CompactedError extends LeaseProxyError {
  override name = "CompactedError";
}

/** The members of an RFC 9457 problem body, plus whatever else the proxy put in it. */
export interface Problem {
  type: string;
  title: string;
  status: number;
  detail?: string;
  [member: string]: unknown;
}

/** Any other problem answer (`application/problem+json`), or a non-2xx answer without one. */
export class ProblemError extends LeaseProxyError {
  override name = "ProblemError";
  constructor(
    /** The HTTP status. */
    readonly status: number,
    /** The whole problem body (`type` is `about:blank` when the body was not a problem). */
    readonly problem: Problem,
    /** `Retry-After` in seconds, when sent. */
    readonly retryAfterSeconds: number | undefined = undefined,
  ) {
    super(`${status} ${problem.title}: ${problem.detail ?? ""} (${problem.type})`);
  }

  /** The last segment of the problem `type` (`etcd-unavailable`…). */
  get slug(): string {
    const type = this.problem.type;
    return type.startsWith(PROBLEM_BASE) ? type.slice(PROBLEM_BASE.length) : "";
  }
}

/**
 * The proxy answered something that is not its API: not JSON, a field missing or of the wrong
 * type, an impossible value, a body or an event-stream line over 1 MiB.
 */
export class ProtocolError extends LeaseProxyError {
  override name = "ProtocolError";
}

/** The request could not be delivered, or its answer not read in full. `cause` says why. */
export class TransportError extends LeaseProxyError {
  override name = "TransportError";
}

/** The request (or its answer) took longer than the client's timeout. */
export class TimeoutError extends TransportError {
  override name = "TimeoutError";
}

/** Bad client options: a URL that is not http(s), an unreadable CA file… */
export class ConfigError extends LeaseProxyError {
  override name = "ConfigError";
}

/** Whether retrying the same request may succeed: not delivered, or the proxy briefly unable. */
export function isTransient(error: unknown): boolean {
  if (error instanceof TransportError) return true;
  return error instanceof ProblemError && error.status >= 502 && error.status <= 504;
}

/** Whether a watch reconnects after `error`: a transient one, any 5xx, or a 429. */
export function reconnectsWatch(error: unknown): boolean {
  if (isTransient(error)) return true;
  return error instanceof ProblemError && (error.status === 429 || error.status >= 500);
}

/** `Retry-After` as whole seconds, when it is one. */
function retryAfter(headers: Headers): number | undefined {
  const value = headers.get("retry-after");
  return value !== null && /^\d{1,9}$/.test(value.trim()) ? Number(value.trim()) : undefined;
}

/** The error for a non-2xx answer with `status`, `headers` and the (limited) `body`. */
export function errorFor(status: number, headers: Headers, body: Uint8Array): LeaseProxyError {
  const text = new TextDecoder().decode(body);
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch {
    parsed = undefined;
  }
  const fields = isObject(parsed) ? parsed : {};
  const type = typeof fields.type === "string" ? fields.type : "about:blank";
  const slug = type.startsWith(PROBLEM_BASE) ? type.slice(PROBLEM_BASE.length) : "";
  if (status === 409 && slug === "lease-held") return held(fields, headers, text);
  if (status === 410 && slug === "lease-lost") {
    return new LostError("revoked", str(fields.resource), str(fields.detail) || "410 lease-lost");
  }
  if (status === 410 && slug === "session-lost") {
    return new SessionLostError(str(fields.detail) || "410 session-lost");
  }
  if (status === 410 && slug === "events-compacted") {
    return new CompactedError(str(fields.detail) || "410 events-compacted");
  }
  const problem: Problem = {
    ...fields,
    type,
    title: typeof fields.title === "string" ? fields.title : `HTTP ${status}`,
    status,
    detail: typeof fields.detail === "string" ? fields.detail : isObject(parsed) ? undefined : text.slice(0, 500),
  };
  return new ProblemError(status, problem, retryAfter(headers));
}

function held(fields: Record<string, unknown>, headers: Headers, text: string): LeaseProxyError {
  const token = typeof fields.token === "string" && /^\d{1,20}$/.test(fields.token) ? BigInt(fields.token) : undefined;
  const expires = fields.expires_in_ms;
  if (typeof fields.holder !== "string" || token === undefined || !isCount(expires ?? 0)) {
    return new ProtocolError(`409 lease-held without a holder and a decimal token: ${text.slice(0, 500)}`);
  }
  return new HeldError(fields.holder, token, Number(expires ?? 0), retryAfter(headers));
}

function str(value: unknown): string {
  return typeof value === "string" ? value : "";
}

/** A plain JSON object. */
export function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

/** A whole number ≥ 0 that JSON can carry exactly. */
export function isCount(value: unknown): value is number {
  return typeof value === "number" && Number.isSafeInteger(value) && value >= 0;
}
