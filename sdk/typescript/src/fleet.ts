/**
 * Fleets (`/v1/fleets`): a named set of resources the service shares among its members. A member
 * is a session; what it is assigned are ordinary grants under it, so each is a Lease here, lost
 * — its signal aborted — when the service moves it away (`handed-off`), takes it back, or the
 * session is lost. The assignment is read by long polls.
 */

import { LostError, ProblemError, ProtocolError, SessionLostError, isTransient } from "./errors.js";
import { SECRET_HEADER, segment } from "./http.js";
import { Lease } from "./lease.js";
import { Liveness } from "./liveness.js";
import { Fields, parseOpened, type Grant } from "./model.js";
import { sleep } from "./renewal.js";
import type { Session } from "./session.js";
import type { Internals } from "./client.js";

/** How to join a fleet. */
export interface JoinOptions {
  /** The member's name (the resource grammar); a live member of the same name is replaced. */
  member: string;
  /** The member's session TTL, whole seconds. */
  ttlSeconds: number;
  /** Its share's weight, 1 to 1000. */
  weight?: number;
  /** How long each long poll of the assignment waits for a change (default 20 s; a proxy whose `--max-wait` is shorter refuses it, and the member then polls with its maximum). */
  pollWaitMs?: number;
  /**
   * Whether a member whose session ended (its TTL passed without a keepalive, its etcd lease
   * revoked: the service answers 404 `no-member`, or the keepalives are refused) joins again
   * under the same name with a new session (`true`) — its old leases lost, the next change
   * saying `rejoined`; static membership gives back, within the TTL, what it still held, under
   * new tokens — or ends, `signal.reason` saying why (`false`, the default).
   */
  rejoin?: boolean;
}

/** What changed in a member's assignment. */
export interface AssignmentChange {
  /** The assignment's revision. */
  revision: bigint;
  /** `active`, `draining` or `evicted`. */
  state: string;
  /** Every resource held and assigned now. */
  held: Lease[];
  /** Newly assigned: start working on these. */
  added: Lease[];
  /**
   * Moved away: their signals are aborted (`handed-off`); release each once its work has
   * stopped, by its `releaseBy`.
   */
  releasing: Lease[];
  /** Gone without a hand-off (revoked, the member evicted): their signals are aborted. */
  removed: Lease[];
  /**
   * The first change under a new session after the old one ended (`rejoin: true`): every lease
   * of the old one was lost (`session-lost`).
   */
  rejoined: boolean;
}

/** A fleet as `PUT /v1/fleets/{fleet}` sets it. */
export interface FleetSpec {
  resources: string[];
  drainMs?: number;
  maxMoves?: number;
}

interface HeldGrant {
  resource: string;
  leaseId: string;
  token: bigint;
  fencingToken: string;
}

interface MemberView {
  state: string;
  revision: bigint;
  held: HeldGrant[];
  /** Resources moved away, each with the milliseconds left to release it (on the proxy's clock). */
  releasing: Map<string, number>;
}

/** The longest hand-off deadline believed (the service allows `drain_ms` up to an hour). */
const MAX_RELEASE_MS = 3_600_000;

/**
 * When a hand-off told in an answer that arrived at `received` (performance.now() ms), with
 * `deadlineMs` left before the service revokes the grant, must be done: less a margin of a tenth
 * of it, at least 100 ms, and never before `received`.
 */
export function releaseBy(received: number, deadlineMs: number): number {
  const left = Math.min(deadlineMs, MAX_RELEASE_MS);
  return received + Math.max(0, left - Math.max(left / 10, 100));
}

function parseView(body: unknown): MemberView {
  const f = new Fields(body, "fleet assignment");
  return {
    state: f.string("state"),
    revision: f.decimal("revision"),
    held: f.array("held").map((h) => {
      const g = new Fields(h, "fleet assignment: held");
      return { resource: g.string("resource"), leaseId: g.string("lease_id"), token: g.decimal("token"), fencingToken: g.string("fencing_token") };
    }),
    releasing: new Map(
      f.array("releasing").map((r) => {
        const g = new Fields(r, "fleet assignment: releasing");
        return [g.string("resource"), g.count("deadline_ms")];
      }),
    ),
  };
}

const fleetPath = (fleet: string) => `/v1/fleets/${segment(fleet)}`;

/** The shortest long poll a member settles for: below it, a proxy refusing the wait is a refusal. */
const MIN_POLL_MS = 100;

/**
 * When `e` is the proxy's refusal of a poll's `wait_ms` (400 `invalid-field`: longer than its
 * `--max-wait`), the wait to use instead: the "at most N" it names, else half of `current`.
 */
function shorterWait(e: unknown, current: number): number | undefined {
  if (!(e instanceof ProblemError) || e.status !== 400 || e.slug !== "invalid-field") return undefined;
  const detail = e.problem.detail ?? "";
  if (!detail.includes("wait_ms")) return undefined;
  const named = /at most (\d+)/.exec(detail);
  const next = named !== null && Number(named[1]) < current ? Number(named[1]) : Math.floor(current / 2);
  return next >= MIN_POLL_MS ? next : undefined;
}

/** A member of a fleet: its session, its assignment, drain and leave. */
export class FleetMember {
  private readonly current = new Map<string, Lease>();
  /** The leases of `current` told they were moved away, until the view stops listing them. */
  private readonly handedOff = new Set<Lease>();
  private readonly path: string;
  /** How long each long poll waits: the option, shortened to the proxy's `--max-wait` when it refuses it. */
  private pollWaitMs: number;
  private readonly rejoin: boolean;
  /** With `rejoin`: aborted when the member ends (left, evicted, a join again refused). */
  private readonly ended_ = new AbortController();
  /** Left, evicted, or unknown to the service otherwise than by its session's end: no rejoin follows. */
  private finished = false;
  private rejoinCount = 0;

  /** @internal Made by `Client.joinFleet`. */
  constructor(
    private readonly internals: Internals,
    readonly fleet: string,
    readonly member: string,
    private session_: Session,
    options: JoinOptions,
    /** Joins again under the same name (`rejoin`). */
    private readonly open: () => Promise<Session>,
  ) {
    this.path = `${fleetPath(fleet)}/members/${segment(member)}`;
    this.pollWaitMs = options.pollWaitMs ?? 20_000;
    this.rejoin = options.rejoin ?? false;
  }

  /** The member's session now: its loss ends every lease of the fleet it holds. A rejoin replaces it. */
  get session(): Session {
    return this.session_;
  }

  /** How many times the member joined again after its session ended (`rejoin`). */
  get rejoins(): number {
    return this.rejoinCount;
  }

  /**
   * Aborted when the member ends: its session is lost (without `rejoin`), it is evicted, it
   * leaves, or (with `rejoin`) joining again is refused.
   */
  get signal(): AbortSignal {
    return this.rejoin ? this.ended_.signal : this.session_.signal;
  }

  /** The leases held and assigned now. */
  get held(): Lease[] {
    return [...this.current.values()].filter((l) => !l.isLost());
  }

  /**
   * The assignment's changes, from the first (everything held at once) on, by long polls; ends
   * when the member's session is lost (`signal.reason` says why: the service no longer knowing
   * the member — its session ended, it was replaced — included) or it is evicted. Transient
   * failures and malformed answers (a foreign grant included) are retried, a malformed one
   * changing nothing; any other refusal is thrown.
   */
  async *assignments(): AsyncGenerator<AssignmentChange> {
    let after: bigint | undefined;
    let rejoined = false;
    for (let attempt = 0; ; ) {
      if (this.session.isLost()) {
        if (!(await this.joinAgain())) return;
        after = undefined;
        rejoined = true;
        continue;
      }
      let view: MemberView;
      let received: number;
      try {
        view = await this.poll(after);
        received = performance.now();
        attempt = 0;
      } catch (e) {
        if (this.session.isLost() || this.ended(e)) continue; // ended, or joined again above
        const shorter = shorterWait(e, this.pollWaitMs);
        if (shorter !== undefined) {
          this.pollWaitMs = shorter;
          continue;
        }
        // A malformed answer changes nothing and is read again, as a transient failure is.
        if (!isTransient(e) && !(e instanceof ProtocolError)) throw e;
        await sleep(Math.min(100 * 2 ** attempt++, 2000), this.session.signal);
        continue;
      }
      if (after !== undefined && view.revision < after) {
        // Older than what was applied (a lagging replica, a reordering relay): applying it would
        // bring back grants handed off or revoked since. Asked again after a pause, so that a
        // server answering so at once is not polled in a tight loop.
        await sleep(100, this.session.signal);
        continue;
      }
      if (after !== undefined && view.revision === after) continue; // the wait ended without a change
      after = view.revision;
      const change = this.apply(view, received, rejoined);
      rejoined = false;
      if (view.state === "evicted") this.over("the member was evicted from the fleet");
      yield change;
      if (view.state === "evicted") return;
    }
  }

  private async poll(after: bigint | undefined): Promise<MemberView> {
    const wait = this.pollWaitMs;
    const query: Record<string, string> = after === undefined ? {} : { after: after.toString(), wait_ms: String(wait) };
    const view = parseView(
      await this.internals.transport.call({
        method: "GET",
        path: this.path,
        query,
        headers: { [SECRET_HEADER]: this.session.opened.secret },
        extraTimeoutMs: after === undefined ? 0 : wait,
        signal: this.session.signal,
      }),
    );
    // A fleet grant lives on the member's session: one under another lease is not this
    // member's, and a view listing it is not believed at all.
    const foreign = view.held.find((h) => h.leaseId !== this.session.id);
    if (foreign !== undefined) {
      throw new ProtocolError(`fleet assignment: ${foreign.resource} held under lease ${foreign.leaseId}, not the member's session ${this.session.id}`);
    }
    return view;
  }

  /**
   * Whether a refusal of the poll means the member is gone — 404 `no-member` (its session
   * ended), `no-fleet`, 403 `not-member` (replaced by a new join), 410 `session-lost` —: then
   * its session is lost with that reason.
   */
  private ended(e: unknown): boolean {
    const gone = e instanceof SessionLostError || (e instanceof ProblemError && (e.status === 403 || e.status === 404));
    if (!gone) return false;
    const detail = `the fleet no longer knows this member: ${(e as Error).message}`;
    // Its session ended (404 no-member, 410): with rejoin, the member joins again.
    if (this.rejoin && (e instanceof SessionLostError || (e as ProblemError).slug === "no-member")) this.loseSession(detail);
    else this.over(detail);
    return true;
  }

  /**
   * The member is over — evicted (it gets nothing until it joins again), or unknown to the
   * service —: its session is lost, and closed rather than kept alive for nothing (a deleted
   * fleet's members' sessions stay open on the server).
   */
  private over(detail: string): void {
    this.finished = true;
    this.loseSession(detail);
    this.ended_.abort(this.session.signal.reason);
  }

  private loseSession(detail: string): void {
    this.session.liveness.lose("revoked", detail);
    this.session.close().catch(() => {});
  }

  /**
   * After the member's session was lost: with `rejoin` (and unless the member is over), joins
   * again under its name, retrying transient failures, and installs the new session — true —;
   * otherwise the member ends — false.
   */
  private async joinAgain(): Promise<boolean> {
    for (let attempt = 0; this.rejoin && !this.finished; ) {
      try {
        const next = await this.open();
        if (this.finished) {
          await next.close().catch(() => {});
          break;
        }
        this.session_ = next;
        this.current.clear();
        this.handedOff.clear();
        this.rejoinCount++;
        return true;
      } catch (e) {
        if (this.finished) break;
        if (!isTransient(e)) {
          this.finished = true;
          this.ended_.abort(new LostError("revoked", "", `joining ${this.fleet} again as ${this.member}: ${(e as Error).message}`));
          break;
        }
        await sleep(Math.min(100 * 2 ** attempt++, 2000), this.ended_.signal);
      }
    }
    this.finished = true;
    if (!this.ended_.signal.aborted) this.ended_.abort(this.session.signal.reason);
    return false;
  }

  /**
   * Takes in an assignment that arrived at `received`: the leases added, handed off (with their
   * `releaseBy`) and removed since the last one.
   */
  private apply(view: MemberView, received: number, rejoined: boolean): AssignmentChange {
    const change: AssignmentChange = { revision: view.revision, state: view.state, held: [], added: [], releasing: [], removed: [], rejoined };
    const assigned = new Map(view.held.map((h) => [h.resource, h]));
    const moving = view.releasing;
    for (const [resource, lease] of this.current) {
      const h = assigned.get(resource);
      // The same grant: delivered once, and never again once lost here (its work returned and
      // released it while this view was on its way, say).
      if (h?.token === lease.token) continue;
      if (h === undefined && moving.has(resource)) {
        // Moved away: told once, and kept while the view lists it, so that it is released when
        // its work has returned, not as a grant never seen.
        if (!this.handedOff.has(lease)) {
          this.handedOff.add(lease);
          lease.markHandedOff(releaseBy(received, moving.get(resource) ?? 0), "the fleet moved it to another member: release it");
          change.releasing.push(lease);
        }
        continue;
      }
      this.current.delete(resource);
      if (this.handedOff.delete(lease)) continue;
      this.lose(lease, "revoked", `no longer assigned (assignment revision ${view.revision})`);
      change.removed.push(lease);
    }
    for (const h of view.held) {
      const known = this.current.get(h.resource);
      if (known !== undefined) {
        if (!known.isLost()) change.held.push(known);
        continue;
      }
      const lease = this.lease(h);
      this.current.set(h.resource, lease);
      change.held.push(lease);
      change.added.push(lease);
    }
    // Granted and moved away between two reads: nothing of this member's runs on it, so it is
    // given back at once rather than at the drain deadline.
    for (const resource of moving.keys()) if (!this.current.has(resource)) this.releaseUnseen(resource);
    return change;
  }

  private releaseUnseen(resource: string): void {
    this.internals.transport
      .call({ method: "DELETE", path: `/v1/leases/${segment(resource)}`, headers: { [SECRET_HEADER]: this.session.opened.secret } })
      .catch(() => {});
  }

  private lease(h: HeldGrant): Lease {
    const grant: Grant = {
      resource: h.resource,
      holder: this.member,
      leaseId: h.leaseId,
      secret: this.session.opened.secret, // a fleet grant is released with its session's secret
      token: h.token,
      fencingToken: h.fencingToken,
      ttlSeconds: this.session.opened.ttlSeconds,
      expiresInMs: 0,
      session: this.session.id,
    };
    const liveness = new Liveness(h.resource, 0, this.session.liveness);
    this.internals.watchLoss(h.resource, h.token, liveness);
    // Released only while this member still holds this grant (held, or to hand off).
    const lease: Lease = new Lease(this.internals, grant, liveness, undefined, () => this.current.get(h.resource) === lease);
    return lease;
  }

  private lose(lease: Lease, reason: "revoked", detail: string): void {
    lease.markLost(reason, detail);
  }

  /**
   * Runs `work` for every resource assigned, with the lease's signal (aborted when it is moved
   * away, taken back, or the session is lost), and releases the resource once its work has
   * returned — a moved one as the contract asks; one still assigned is given back, and the
   * service grants it again (to this member, likely) under a new token. Resolves when the
   * member's session is lost or it is evicted (after leave(), say), once every work returned.
   */
  async run(work: (lease: Lease, signal: AbortSignal) => Promise<void>): Promise<void> {
    const running = new Set<Promise<void>>();
    try {
      for await (const change of this.assignments()) {
        for (const lease of change.added) {
          const done: Promise<void> = work(lease, lease.signal)
            .catch(() => {})
            .then(() => lease.release().catch(() => {}))
            .finally(() => running.delete(done));
          running.add(done);
        }
      }
    } finally {
      await Promise.all(running);
    }
  }

  /** Hands everything off and takes nothing new (`POST …/drain`); watch `assignments()` empty. */
  async drain(): Promise<void> {
    await this.internals.transport.call({
      method: "POST",
      path: `${this.path}/drain`,
      headers: { [SECRET_HEADER]: this.session.opened.secret },
      json: {},
    });
  }

  /** Leaves the fleet: closes the member's session, ending every grant it holds. */
  async leave(): Promise<void> {
    this.finished = true;
    const closing = this.session.close();
    if (!this.ended_.signal.aborted) this.ended_.abort(this.session.signal.reason);
    await closing;
  }
}

/** `POST /v1/fleets/{fleet}/members`: joins, and keeps the member's session alive. */
export async function join(internals: Internals, keep: KeepSession, fleet: string, options: JoinOptions): Promise<FleetMember> {
  const open = () => openMember(internals, keep, fleet, options);
  return new FleetMember(internals, fleet, options.member, await open(), options, open);
}

/** One join: the member's session, kept alive. */
async function openMember(internals: Internals, keep: KeepSession, fleet: string, options: JoinOptions): Promise<Session> {
  const body: Record<string, unknown> = { member: options.member, ttl_seconds: options.ttlSeconds };
  if (options.weight !== undefined) body.weight = options.weight;
  const sentAt = performance.now();
  const answer = await internals.transport.call({ method: "POST", path: `${fleetPath(fleet)}/members`, json: body });
  const opened = parseOpened({ ...(answer as object), holder: options.member });
  return keep(opened, sentAt, `${fleet}/${options.member}`);
}

/** How the client keeps a session it did not open itself. */
export type KeepSession = (opened: ReturnType<typeof parseOpened>, sentAt: number, name: string) => Session;

/** `PUT /v1/fleets/{fleet}`: creates or changes it; its revision. */
export async function putFleet(internals: Internals, fleet: string, spec: FleetSpec): Promise<bigint> {
  const body: Record<string, unknown> = { resources: spec.resources };
  if (spec.drainMs !== undefined) body.drain_ms = spec.drainMs;
  if (spec.maxMoves !== undefined) body.max_moves = spec.maxMoves;
  const answer = await internals.transport.call({ method: "PUT", path: fleetPath(fleet), json: body });
  return new Fields(answer, "fleet answer").decimal("revision");
}

/** A fleet as it stands, without secrets (`GET /v1/fleets/{fleet}`). */
export interface FleetView {
  fleet: string;
  resources: string[];
  drainMs: number;
  maxMoves: number;
  revision: bigint;
  members: { member: string; weight: number; state: string; held: string[]; releasing: string[] }[];
  /** What no member holds now (free, between a release and the next grant, or held outside the fleet). */
  unassigned: string[];
}

function names(f: Fields, name: string, what: string): string[] {
  const list = f.array(name);
  if (!list.every((n): n is string => typeof n === "string")) throw new ProtocolError(`${what}: ${name} is not a list of names`);
  return list;
}

/** `GET /v1/fleets/{fleet}`: the fleet, or undefined when there is none. */
export async function getFleet(internals: Internals, fleet: string): Promise<FleetView | undefined> {
  let answer: unknown;
  try {
    answer = await internals.transport.call({ method: "GET", path: fleetPath(fleet) });
  } catch (e) {
    if (e instanceof ProblemError && e.slug === "no-fleet") return undefined;
    throw e;
  }
  const f = new Fields(answer, "fleet");
  return {
    fleet: f.string("fleet"),
    resources: names(f, "resources", "fleet"),
    drainMs: f.count("drain_ms"),
    maxMoves: f.count("max_moves"),
    revision: f.decimal("revision"),
    members: f.array("members").map((m) => {
      const g = new Fields(m, "fleet: member");
      return {
        member: g.string("member"),
        weight: g.count("weight"),
        state: g.string("state"),
        held: names(g, "held", "fleet: member"),
        releasing: names(g, "releasing", "fleet: member"),
      };
    }),
    unassigned: names(f, "unassigned", "fleet"),
  };
}

/**
 * `POST /v1/fleets/{fleet}/members/{member}/drain` without a secret (an operator's call): it hands
 * everything off and takes nothing new. A member drains itself with `FleetMember.drain()`.
 */
export async function drainMember(internals: Internals, fleet: string, member: string): Promise<void> {
  await internals.transport.call({ method: "POST", path: `${fleetPath(fleet)}/members/${segment(member)}/drain` });
}

/** `DELETE /v1/fleets/{fleet}/members/{member}` (an operator's call): evicts it, its grants end at once. */
export async function evictMember(internals: Internals, fleet: string, member: string): Promise<void> {
  await internals.transport.call({ method: "DELETE", path: `${fleetPath(fleet)}/members/${segment(member)}` });
}

/** `DELETE /v1/fleets/{fleet}`: ends it, releasing its members' grants. */
export async function deleteFleet(internals: Internals, fleet: string): Promise<void> {
  await internals.transport.call({ method: "DELETE", path: fleetPath(fleet) });
}
