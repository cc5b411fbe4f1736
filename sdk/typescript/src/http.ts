/**
 * The one way requests reach the proxy: Node's `fetch` with the bearer token, a timeout that
 * covers the whole answer (headers and body), a 1 MiB limit on the API's answers, and every
 * failure turned into one of the package's errors.
 */

import { readFileSync } from "node:fs";

import {
  ConfigError,
  LeaseProxyError,
  ProtocolError,
  TimeoutError,
  TransportError,
  errorFor,
} from "./errors.js";
import { link } from "./signals.js";

/** The most bytes the body of an answer of the API may have (not a forwarded answer's). */
export const MAX_BODY = 1 << 20;
/** The header carrying a grant's or a session's secret. */
export const SECRET_HEADER = "lease-secret";

/** TLS settings for an `https://` proxy (see the README: how this works without undici). */
export interface TlsOptions {
  /** CA certificates (PEM text, or a path to a PEM file) trusted instead of Node's roots. */
  ca?: string | Buffer;
  /** A client certificate (PEM, or a path) for mTLS, with `key`. */
  cert?: string | Buffer;
  /** The client certificate's private key (PEM, or a path). */
  key?: string | Buffer;
}

/** How the transport is set up (a subset of the client's options). */
export interface TransportOptions {
  /** `Authorization: Bearer …` on every request (proxies run with `--auth-tokens`). */
  token?: string;
  /** The longest one request may take, answer included (default 10 s); a waiting acquire adds its wait. */
  timeoutMs?: number;
  /** TLS trust and identity for `https://`. */
  tls?: TlsOptions;
  /** An undici `Dispatcher` passed to every `fetch` (overrides `tls`). */
  dispatcher?: unknown;
  /** The `fetch` to use (default: Node's global one). */
  fetch?: typeof fetch;
  /** The `User-Agent` header. */
  userAgent?: string;
}

/** One request to send. */
export interface Call {
  method: string;
  path: string;
  headers?: Record<string, string>;
  json?: unknown;
  query?: Record<string, string>;
  /** Added to the timeout (a waiting acquire's wait). */
  extraTimeoutMs?: number;
  /** The caller's own cancellation. */
  signal?: AbortSignal;
}

/** A whole answer, its body read. */
export interface Answer {
  status: number;
  headers: Headers;
  body: Uint8Array;
}

/**
 * `value` as one URL path segment: letters, digits and `._:-` as they are, every other byte
 * (UTF-8) as `%XX`, so the proxy sees the name as given (`x/../victim` stays one segment). The
 * names a URL cannot carry as a segment (empty, `.`, `..`) are sent as `...`, which the proxy
 * refuses as it refuses them, never as the path around them.
 */
export function segment(value: string): string {
  if (value === "" || value === "." || value === "..") return "...";
  let out = "";
  for (const byte of new TextEncoder().encode(value)) {
    const c = String.fromCharCode(byte);
    out += /[A-Za-z0-9._:-]/.test(c) ? c : `%${byte.toString(16).toUpperCase().padStart(2, "0")}`;
  }
  return out;
}

function pem(value: string | Buffer): string | Buffer {
  if (typeof value !== "string" || value.includes("-----BEGIN")) return value;
  try {
    return readFileSync(value);
  } catch (e) {
    throw new ConfigError(`TLS file ${value}: ${(e as Error).message}`);
  }
}

/**
 * An undici Agent with `tls`, made from the Agent class of the undici that Node bundles for its
 * `fetch` (reached through the global dispatcher undici registers under a `Symbol.for` key):
 * Node 20's `fetch` takes no CA option, and the `undici` package would be a runtime dependency.
 */
async function tlsDispatcher(tls: TlsOptions): Promise<unknown> {
  await (await fetch("data:,")).arrayBuffer(); // makes Node load its undici and register its dispatcher
  const global = (globalThis as Record<symbol, unknown>)[Symbol.for("undici.globalDispatcher.1")];
  const Agent = (global as { constructor?: new (options: unknown) => unknown } | undefined)?.constructor;
  if (typeof Agent !== "function" || Agent === Object) {
    throw new ConfigError(
      "this Node's fetch exposes no undici Agent: set NODE_EXTRA_CA_CERTS, or pass a dispatcher from the undici package",
    );
  }
  const connect: Record<string, unknown> = {};
  if (tls.ca !== undefined) connect.ca = pem(tls.ca);
  if (tls.cert !== undefined) connect.cert = pem(tls.cert);
  if (tls.key !== undefined) connect.key = pem(tls.key);
  return new Agent({ connect });
}

/** A request sent: its answer (headers read, body not yet), and how to detach its signal. */
export interface Sent {
  response: Response;
  done(): void;
}

/** Node's fetch takes an undici dispatcher in its init; the DOM types do not know it. */
type FetchInit = Omit<RequestInit, "dispatcher"> & { dispatcher?: unknown };

/** Sends the calls of one client. */
export class Transport {
  readonly base: string;
  readonly timeoutMs: number;
  private readonly fetchImpl: typeof fetch;
  private readonly headers: Record<string, string>;
  private dispatcher: Promise<unknown> | undefined;

  constructor(baseUrl: string, options: TransportOptions = {}) {
    let url: URL;
    try {
      url = new URL(baseUrl);
    } catch {
      throw new ConfigError(`base URL ${JSON.stringify(baseUrl)} is not a URL`);
    }
    if (url.protocol !== "http:" && url.protocol !== "https:") {
      throw new ConfigError(`base URL ${JSON.stringify(baseUrl)}: the scheme must be http or https`);
    }
    this.base = baseUrl.replace(/\/+$/, "");
    this.timeoutMs = options.timeoutMs ?? 10_000;
    this.fetchImpl = options.fetch ?? ((input, init) => fetch(input, init));
    this.headers = { "user-agent": options.userAgent ?? "lease-proxy-client-ts/0.1.0" };
    if (options.token !== undefined) this.headers.authorization = `Bearer ${options.token}`;
    if (options.dispatcher !== undefined) this.dispatcher = Promise.resolve(options.dispatcher);
    else if (options.tls !== undefined) {
      this.dispatcher = tlsDispatcher(options.tls);
      this.dispatcher.catch(() => {}); // reported by the first request instead
    }
  }

  /** The full URL of `path` (already encoded) with `query`. */
  url(path: string, query?: Record<string, string>): string {
    const q = query && Object.keys(query).length > 0 ? `?${new URLSearchParams(query)}` : "";
    return `${this.base}${path}${q}`;
  }

  /**
   * Sends `init` to `url` with the client's headers and dispatcher; `timeout`, `signal` and
   * `init.signal` abort it, until `done()` (or the first of them aborting) detaches it from
   * them — call it once the answer is read, or leave it to the timeout. Transport failures are
   * TransportErrors; the caller's own abort rethrows its reason.
   */
  async send(url: string, init: FetchInit, timeout: AbortSignal | undefined, signal?: AbortSignal): Promise<Sent> {
    const headers = new Headers(init.headers);
    for (const [name, value] of Object.entries(this.headers)) if (!headers.has(name)) headers.set(name, value);
    const linked = link(timeout, signal, init.signal ?? undefined);
    const full: FetchInit = { ...init, headers, signal: linked.signal };
    try {
      if (this.dispatcher !== undefined) full.dispatcher = await this.dispatcher;
      return { response: await this.fetchImpl(url, full as RequestInit), done: linked.dispose };
    } catch (e) {
      linked.dispose();
      throw failure(e, timeout, [signal, init.signal ?? undefined], this.timeoutMs);
    }
  }

  /** Sends `call` and reads its whole answer (up to MAX_BODY bytes) within the timeout. */
  async answer(call: Call): Promise<Answer> {
    const timeoutMs = this.timeoutMs + (call.extraTimeoutMs ?? 0);
    const timeout = AbortSignal.timeout(timeoutMs);
    const headers: Record<string, string> = { ...call.headers };
    let body: string | undefined;
    if (call.json !== undefined) {
      headers["content-type"] = "application/json";
      body = JSON.stringify(call.json);
    }
    const { response, done } = await this.send(this.url(call.path, call.query), { method: call.method, headers, body }, timeout, call.signal);
    try {
      return { status: response.status, headers: response.headers, body: await readLimited(response) };
    } catch (e) {
      throw failure(e, timeout, [call.signal], timeoutMs);
    } finally {
      done();
    }
  }

  /** Sends `call`: a 2xx answer's JSON body (undefined when empty), else the answer's error. */
  async call(call: Call): Promise<unknown> {
    const answer = await this.answer(call);
    if (answer.status < 200 || answer.status > 299) throw errorFor(answer.status, answer.headers, answer.body);
    if (answer.body.length === 0) return undefined;
    try {
      return JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(answer.body));
    } catch {
      throw new ProtocolError(`${call.method} ${call.path}: ${answer.status} answer is not JSON`);
    }
  }
}

/** Reads `response`'s body, refusing it past MAX_BODY bytes (without reading the rest). */
export async function readLimited(response: Response): Promise<Uint8Array> {
  const declared = Number(response.headers.get("content-length") ?? "0");
  if (declared > MAX_BODY) {
    await response.body?.cancel().catch(() => {});
    throw new ProtocolError(`${response.status} answer: body over ${MAX_BODY} bytes`);
  }
  if (response.body === null) return new Uint8Array();
  const chunks: Uint8Array[] = [];
  let size = 0;
  for await (const chunk of response.body as unknown as AsyncIterable<Uint8Array>) {
    size += chunk.length;
    if (size > MAX_BODY) {
      await response.body.cancel().catch(() => {});
      throw new ProtocolError(`${response.status} answer: body over ${MAX_BODY} bytes`);
    }
    chunks.push(chunk);
  }
  const out = new Uint8Array(size);
  let at = 0;
  for (const c of chunks) {
    out.set(c, at);
    at += c.length;
  }
  return out;
}

/** What a failed fetch or body read becomes: the caller's abort reason, a timeout, or transport. */
function failure(e: unknown, timeout: AbortSignal | undefined, callers: (AbortSignal | undefined)[], ms: number): unknown {
  if (e instanceof LeaseProxyError) return e;
  for (const signal of callers) if (signal?.aborted) return signal.reason;
  if (timeout?.aborted) return new TimeoutError(`no complete answer within ${ms} ms`, { cause: e });
  const cause = (e as { cause?: { code?: string; message?: string } }).cause;
  const why = cause?.code ?? cause?.message ?? (e as Error).message;
  return new TransportError(`request failed: ${why}`, { cause: e });
}
