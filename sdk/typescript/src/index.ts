/**
 * lease-proxy's TypeScript client: exclusive leases on named resources with fencing tokens,
 * whose AbortSignal is aborted the moment the lease is lost.
 *
 * ```ts
 * const client = new Client("http://127.0.0.1:7070");
 * await client.using("aisle-1", { holder: "robot-7", ttlSeconds: 10 }, async (lease, signal) => {
 *   await lease.fetch("http://gateway/aisles/aisle-1/count", { method: "PUT", body: "…" });
 * });
 * ```
 */

export { Client, type AcquireOptions, type ClientOptions } from "./client.js";
export {
  CompactedError,
  ConfigError,
  HeldError,
  LeaseProxyError,
  LostError,
  ProblemError,
  ProtocolError,
  SessionLostError,
  TimeoutError,
  TransportError,
  isTransient,
  type LostReason,
  type Problem,
} from "./errors.js";
export { FleetMember, type AssignmentChange, type FleetSpec, type FleetView, type JoinOptions } from "./fleet.js";
export type { TlsOptions } from "./http.js";
export { Lease } from "./lease.js";
export type { Grant, Holding, LeaseEvent, Renewal } from "./model.js";
export {
  InjectedRefusalError,
  admit,
  fencedTransaction,
  presentToken,
  type AdmitOptions,
  type Lender,
  type Queryable,
} from "./postgres.js";
export { Session, type SessionAcquireOptions } from "./session.js";
export type { TestMode } from "./testmode.js";
export { EventStream, type WatchOptions } from "./watch.js";

/** `fetch` with `lease`'s `Fencing-Token` and `Fencing-Resource` (see `Lease.fetch`). */
export function fencedFetch(lease: import("./lease.js").Lease): typeof fetch {
  return (input, init) => lease.fetch(input, init);
}
