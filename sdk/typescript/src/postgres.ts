/**
 * Token propagation into PostgreSQL (docs/POSTGRES.md): `fencing.admit` called inside the
 * caller's own transaction, so the check and the writes commit together or not at all. Typed
 * against the smallest interface node-postgres (`pg`) satisfies, so `pg` is no dependency.
 */

import { ConfigError } from "./errors.js";
import type { Lease } from "./lease.js";

/** What `admit` needs of a database client: node-postgres's `Client` and `PoolClient` fit. */
export interface Queryable {
  query(text: string, values?: unknown[]): Promise<{ rows: unknown[] }>;
}

/** A pool that lends clients (node-postgres's `Pool`). */
export interface Lender {
  connect(): Promise<Queryable & { release(error?: Error | boolean): void }>;
}

/** Where the in-database package lives. */
export interface AdmitOptions {
  /** The package's schema (`fence-gateway pg install --schema`, default `fencing`). */
  schema?: string;
}

/** A refusal as the database gives it, when the client's test mode injects one. */
export class InjectedRefusalError extends Error {
  override name = "InjectedRefusalError";
  /** PostgreSQL's SQLSTATE for a stale token, as the package raises it. */
  readonly code = "23F01";
  readonly injected = true;
}

function schemaOf(options: AdmitOptions): string {
  const schema = options.schema ?? "fencing";
  if (!/^[A-Za-z_][A-Za-z0-9_]{0,62}$/.test(schema)) throw new ConfigError(`not a plain schema name: ${schema}`);
  return `"${schema}"`;
}

/**
 * `SELECT fencing.admit(resource, token)` for `lease` on `db`, inside the transaction the
 * caller has begun: verifies the token, refuses it below the resource's mark (SQLSTATE
 * `23F01`, thrown by the driver), raises the mark above it, and holds the lock that orders it
 * until the transaction ends. Throws the LostError without asking once the lease is lost.
 * Resolves with the admitted mark (`era:revision`).
 */
export async function admit(db: Queryable, lease: Lease, options: AdmitOptions = {}): Promise<string> {
  lease.throwIfLost();
  const faults = (lease as unknown as { context: { faults?: { refuseToken(): boolean } } }).context.faults;
  if (faults?.refuseToken()) {
    throw new InjectedRefusalError(`injected by the client's test mode: a newer holder of ${lease.resource} has written`);
  }
  const { rows } = await db.query(`SELECT ${schemaOf(options)}.admit($1, $2) AS mark`, [lease.resource, lease.fencingToken]);
  const row = rows[0] as { mark?: unknown } | undefined;
  return String(row?.mark ?? "");
}

/**
 * For tables protected in trigger mode (`fencing.protect`): presents the lease's token for the
 * rest of the caller's transaction (`set_config('fencing.token', token, true)`); the trigger
 * verifies it for each row written.
 */
export async function presentToken(db: Queryable, lease: Lease): Promise<void> {
  lease.throwIfLost();
  await db.query("SELECT set_config('fencing.token', $1, true)", [lease.fencingToken]);
}

/**
 * Runs `work` in a transaction on a client from `pool`, admitted for `lease` first; commits
 * only if the lease is still held when `work` is done (else rolls back and throws the
 * LostError). The database, not this check, is what refuses a stale writer: the check only
 * spares a commit that would be refused or is no longer wanted.
 */
export async function fencedTransaction<T>(
  pool: Lender,
  lease: Lease,
  work: (db: Queryable) => Promise<T>,
  options: AdmitOptions = {},
): Promise<T> {
  const db = await pool.connect();
  let broken: Error | undefined;
  try {
    await db.query("BEGIN");
    try {
      await admit(db, lease, options);
      const result = await work(db);
      lease.throwIfLost();
      await db.query("COMMIT");
      return result;
    } catch (e) {
      await db.query("ROLLBACK").catch((rollback: Error) => (broken = rollback));
      throw e;
    }
  } finally {
    db.release(broken);
  }
}
