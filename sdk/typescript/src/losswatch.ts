/**
 * The server's word on loss: one `/v1/watch` stream per client, open while the client holds a
 * lease, whose events end a lease the moment the proxy reports its grant released or expired
 * (same resource AND token) or another grant of its resource (a larger token). An accelerator:
 * the renewals and the stop-by deadline stay the guarantee, so a stream the proxy refuses (no
 * `read` permission, an older proxy) only switches it off.
 */

import { CompactedError, ProtocolError, type LeaseProxyError } from "./errors.js";
import type { Transport } from "./http.js";
import type { Liveness } from "./liveness.js";
import type { LeaseEvent } from "./model.js";
import { sleep } from "./renewal.js";
import { EventStream } from "./watch.js";

/** Events kept to check a lease registered after the stream passed its grant. */
const RECENT = 1024;

interface Watched {
  token: bigint;
  liveness: Liveness;
}

/** The revision an event id names (`1235.1` → 1235). */
function revisionOf(id: string): bigint | undefined {
  const head = id.split(".")[0];
  return /^\d{1,20}$/.test(head) ? BigInt(head) : undefined;
}

/** The earlier of two resume points (an unknown one is "from now", the latest). */
function min(a: string | undefined, b: string | undefined): string | undefined {
  if (a === undefined || b === undefined) return a ?? b;
  const ra = revisionOf(a);
  const rb = revisionOf(b);
  if (ra === undefined || rb === undefined) return b;
  return rb < ra ? b : a;
}

/** The longest common prefix of `names`. */
function commonPrefix(names: Iterable<string>): string {
  let prefix: string | undefined;
  for (const name of names) {
    if (prefix === undefined) prefix = name;
    let i = 0;
    while (i < prefix.length && i < name.length && prefix[i] === name[i]) i++;
    prefix = prefix.slice(0, i);
  }
  return prefix ?? "";
}

/** Whether `event` ends the grant `w` of its resource. */
export function ends(event: LeaseEvent, w: { token: bigint }): boolean {
  return event.type === "acquired" ? event.token > w.token : event.token === w.token;
}

/** One client's loss stream. */
export class LossWatch {
  private readonly watched = new Map<string, Set<Watched>>();
  private readonly recent: LeaseEvent[] = [];
  private running = false;
  private current: { prefix: string; abort: AbortController } | undefined;
  /** Where the last stream stopped reading. */
  private resumeFrom: string | undefined;
  /** The earliest grant registered since, that the next stream must cover from its revision. */
  private resumeFloor: string | undefined;
  /** Why the stream was switched off, if it was. */
  disabled: LeaseProxyError | undefined;

  constructor(private readonly transport: Transport) {}

  /** Watches the grant of `resource` with `token` until `liveness` is lost (or released). */
  add(resource: string, token: bigint, liveness: Liveness): void {
    if (this.disabled !== undefined || liveness.check()) return;
    const w = { token, liveness };
    const set = this.watched.get(resource) ?? new Set<Watched>();
    set.add(w);
    this.watched.set(resource, set);
    liveness.signal.addEventListener("abort", () => this.remove(resource, w), { once: true });
    for (const event of this.recent) if (event.resource === resource && ends(event, w)) this.end(w, event);
    const covered = this.current !== undefined && resource.startsWith(this.current.prefix);
    if (!covered) {
      // A stream opened (again) for it must show every event after its grant.
      this.resumeFloor = min(this.resumeFloor, token.toString());
      this.current?.abort.abort();
    }
    if (!this.running) void this.run();
  }

  /** Closes the stream (it opens again with the next lease). */
  stop(): void {
    this.current?.abort.abort();
  }

  private remove(resource: string, w: Watched): void {
    const set = this.watched.get(resource);
    set?.delete(w);
    if (set?.size === 0) this.watched.delete(resource);
    if (this.watched.size === 0) this.current?.abort.abort();
  }

  private async run(): Promise<void> {
    this.running = true;
    try {
      while (this.watched.size > 0 && this.disabled === undefined) await this.stream();
    } finally {
      this.running = false;
      this.current = undefined;
      this.resumeFrom = this.resumeFloor = undefined;
    }
  }

  /** One stream, until it ends, is restarted (a resource outside its prefix) or fails. */
  private async stream(): Promise<void> {
    const current = { prefix: commonPrefix(this.watched.keys()), abort: new AbortController() };
    this.current = current;
    const lastEventId = min(this.resumeFrom, this.resumeFloor);
    this.resumeFloor = undefined;
    const events = new EventStream(this.transport, {
      prefix: current.prefix,
      lastEventId,
      signal: current.abort.signal,
    });
    try {
      for await (const event of events) this.onEvent(event);
    } catch (e) {
      if (e instanceof CompactedError) events.lastEventId = undefined;
      else if (!(e instanceof ProtocolError)) {
        this.disabled = e as LeaseProxyError; // 401, 403, 404: renewals alone, as before
        return;
      }
    }
    this.current = undefined;
    this.resumeFrom = events.lastEventId;
    if (!current.abort.signal.aborted) await sleep(100);
  }

  private onEvent(event: LeaseEvent): void {
    this.recent.push(event);
    if (this.recent.length > RECENT) this.recent.shift();
    for (const w of this.watched.get(event.resource) ?? []) if (ends(event, w)) this.end(w, event);
  }

  private end(w: Watched, event: LeaseEvent): void {
    const what = event.type === "acquired" ? `acquired by ${event.holder} (token ${event.token})` : event.type;
    w.liveness.lose("revoked", `the proxy's event stream: ${what} at revision ${event.revision}`, false, event);
  }
}
