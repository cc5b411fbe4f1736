/**
 * `GET /v1/watch` (Server-Sent Events) as an async iterator of events that reconnects and
 * resumes after the last id it saw.
 */

import { ProtocolError, TimeoutError, errorFor, reconnectsWatch } from "./errors.js";
import { readLimited, type Sent, type Transport } from "./http.js";
import { parseEvent, type LeaseEvent } from "./model.js";
import { sleep } from "./renewal.js";
import { link, type Link } from "./signals.js";
import { MAX_LINE, Parser, type Message } from "./sse.js";

/** The proxy sends a comment every 15 s: a stream silent for this long is dead. */
const IDLE_MS = 45_000;
const FIRST_BACKOFF_MS = 100;
const MAX_BACKOFF_MS = 5_000;

/** What to watch. */
export interface WatchOptions {
  /** Resources whose names start with this (all by default). */
  prefix?: string;
  /** Resume after this id (from an earlier stream's `lastEventId`); from now otherwise. */
  lastEventId?: string;
  /** Ends the stream (the iteration finishes) when aborted. */
  signal?: AbortSignal;
  /** A connection silent this long is dropped and resumed (default 45 s). */
  idleMs?: number;
}

/** The connection being read. */
interface Connection {
  reader: AsyncIterator<Uint8Array>;
  abort: AbortController;
  parser: Parser;
  /** Detaches the connection's signal from the stream's. */
  done(): void;
}

/**
 * The events of a watch. Reconnects after transport failures, any 5xx or 429 answer and silent
 * connections (backing off from 100 ms to 5 s, reset once a connection delivers an event),
 * resuming after the last complete message, so nothing is lost or repeated. Id-only messages
 * (where the stream starts, a quiet stream's progress) are never yielded; they move
 * `lastEventId` on. A malformed event, or a line over 1 MiB, is thrown by `next()` as a
 * ProtocolError and the stream goes on: iterate it again to carry on. Ends (throws) on what
 * retrying cannot fix: CompactedError (list, then watch without an id) or a problem such as 401.
 */
export class EventStream implements AsyncIterableIterator<LeaseEvent> {
  /** The id of the last message received: resume after it. */
  lastEventId: string | undefined;
  private readonly ready: (LeaseEvent | Error)[] = [];
  private connection: Connection | undefined;
  private backoff = FIRST_BACKOFF_MS;
  private pauseFirst = false;
  private ended = false;
  private readonly closer = new AbortController();
  private readonly linked: Link;

  constructor(
    private readonly transport: Transport,
    private readonly options: WatchOptions = {},
  ) {
    this.lastEventId = options.lastEventId;
    this.linked = link(options.signal, this.closer.signal);
    this.signal.addEventListener("abort", () => this.drop(), { once: true });
  }

  /** Aborted when the stream is closed (or the caller's signal aborts). */
  private get signal(): AbortSignal {
    return this.linked.signal;
  }

  [Symbol.asyncIterator](): this {
    return this;
  }

  /** Closes the connection; the iteration ends. */
  async return(): Promise<IteratorResult<LeaseEvent>> {
    this.closer.abort();
    return { done: true, value: undefined };
  }

  async next(): Promise<IteratorResult<LeaseEvent>> {
    for (;;) {
      const item = this.ready.shift();
      if (item instanceof Error) throw item;
      if (item !== undefined) return { done: false, value: item };
      if (this.ended || this.signal.aborted) {
        this.drop();
        this.linked.dispose();
        return { done: true, value: undefined };
      }
      if (this.connection === undefined) await this.open();
      else await this.read(this.connection);
    }
  }

  private async open(): Promise<void> {
    if (this.pauseFirst) {
      this.pauseFirst = false;
      await this.pause();
    }
    try {
      this.connection = await this.connect();
    } catch (e) {
      if (this.signal.aborted) return;
      if (!reconnectsWatch(e)) {
        this.ended = true;
        this.ready.push(e as Error);
      } else await this.pause();
    }
  }

  /** `GET /v1/watch`, resuming after the last id; its headers must come within the timeout. */
  private async connect(): Promise<Connection> {
    const abort = new AbortController();
    const timer = setTimeout(
      () => abort.abort(new TimeoutError(`no event-stream answer within ${this.transport.timeoutMs} ms`)),
      this.transport.timeoutMs,
    );
    const headers: Record<string, string> = { accept: "text/event-stream" };
    if (this.lastEventId !== undefined) headers["last-event-id"] = this.lastEventId;
    const query: Record<string, string> = this.options.prefix ? { prefix: this.options.prefix } : {};
    let sent: Sent | undefined;
    try {
      sent = await this.transport.send(this.transport.url("/v1/watch", query), { headers, signal: abort.signal }, undefined, this.signal);
      const { response } = sent;
      if (response.status !== 200 || response.body === null) {
        const body = await readLimited(response).catch(() => new Uint8Array());
        throw errorFor(response.status, response.headers, body);
      }
      const reader = (response.body as unknown as AsyncIterable<Uint8Array>)[Symbol.asyncIterator]();
      return { reader, abort, parser: new Parser(), done: sent.done };
    } catch (e) {
      sent?.done();
      throw e;
    } finally {
      clearTimeout(timer);
    }
  }

  /**
   * Reads one chunk (or notices the connection ended, broke, went silent or was dropped: not
   * every undici ends a body read that is under way when its request is aborted — Debian's
   * Node 18 does not —, so the drop is raced here too).
   */
  private async read(c: Connection): Promise<void> {
    let timer: ReturnType<typeof setTimeout> | undefined;
    let onDrop: (() => void) | undefined;
    const idle = new Promise<"idle">((resolve) => (timer = setTimeout(() => resolve("idle"), this.options.idleMs ?? IDLE_MS)));
    const dropped = new Promise<"broken">((resolve) => {
      onDrop = () => resolve("broken");
      if (c.abort.signal.aborted) onDrop();
      else c.abort.signal.addEventListener("abort", onDrop, { once: true });
    });
    let chunk: IteratorResult<Uint8Array> | "idle" | "broken";
    try {
      chunk = await Promise.race([c.reader.next(), idle, dropped]);
    } catch {
      chunk = "broken";
    } finally {
      clearTimeout(timer);
      if (onDrop !== undefined) c.abort.signal.removeEventListener("abort", onDrop);
    }
    if (chunk === "idle" || chunk === "broken" || chunk.done) {
      this.drop();
      if (!this.signal.aborted) await this.pause();
      return;
    }
    for (const message of c.parser.feed(chunk.value)) this.receive(message);
    if (c.parser.overflowed) {
      this.drop(); // resumes after the last complete message on a new connection
      this.ready.push(new ProtocolError(`watch: an event-stream line or message over ${MAX_LINE} bytes`));
      this.pauseFirst = true;
    }
  }

  /** One message: its id is the resume point; its data, if any, an event. */
  private receive(message: Message): void {
    if (message.id === undefined) return; // the proxy ids every message: not an event of ours
    this.lastEventId = message.id;
    if (message.data === undefined) return;
    this.backoff = FIRST_BACKOFF_MS; // an event (even a malformed one): this connection works
    try {
      this.ready.push(parseEvent(message.id, message.data));
    } catch (e) {
      this.ready.push(e as Error);
    }
  }

  private drop(): void {
    const c = this.connection;
    this.connection = undefined;
    if (c !== undefined) {
      c.abort.abort();
      c.done();
      c.reader.return?.().catch(() => {});
    }
  }

  private async pause(): Promise<void> {
    await sleep(this.backoff * (0.8 + 0.4 * Math.random()), this.signal);
    this.backoff = Math.min(this.backoff * 2, MAX_BACKOFF_MS);
  }
}
