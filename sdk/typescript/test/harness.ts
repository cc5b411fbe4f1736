/**
 * Real dependencies for the tests: an etcd member and the workspace's binaries on free loopback
 * ports (binaries from LEASE_PROXY_BIN, FENCE_GATEWAY_BIN, WAREHOUSE_BIN, DEV_PKI_BIN, else
 * `target/debug/…` under REPO_ROOT), started once per test file and stopped when it ends; a TCP
 * relay that can lose answers; polling with a deadline.
 */

import { spawn, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { createWriteStream, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { createServer, connect, type Socket } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after } from "node:test";

export const ROOT = process.env.REPO_ROOT ?? process.cwd();
const READY_WITHIN_MS = 30_000;

export function binary(env: string, name: string): string {
  return process.env[env] ?? join(ROOT, "target", "debug", name);
}

/** A scratch directory removed when the test file ends. */
export const workdir = mkdtempSync(join(tmpdir(), "lease-proxy-ts-"));
const processes: ChildProcess[] = [];
after(() => {
  for (const p of processes.reverse()) p.kill("SIGKILL");
  if (!process.env.KEEP_TEST_DIR) rmSync(workdir, { recursive: true, force: true });
});

export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const address = server.address();
      server.close(() => resolve(typeof address === "object" && address ? address.port : 0));
    });
  });
}

export const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** Polls `check` until it returns something other than undefined/false, or fails after `withinMs`. */
export async function eventually<T>(check: () => Promise<T | undefined | false>, withinMs: number, what: string): Promise<T> {
  const deadline = performance.now() + withinMs;
  for (;;) {
    try {
      const value = await check();
      if (value !== undefined && value !== false) return value;
    } catch {
      // not yet
    }
    if (performance.now() > deadline) throw new Error(`${what}: not within ${withinMs} ms`);
    await sleep(50);
  }
}

/** Starts `command`, its output in `log` under the workdir; killed when the file's tests end. */
export function start(command: string, args: string[], log: string): ChildProcess {
  const out = createWriteStream(join(workdir, log));
  const child = spawn(command, args, { stdio: ["ignore", "pipe", "pipe"] });
  child.stdout?.pipe(out);
  child.stderr?.pipe(out);
  processes.push(child);
  return child;
}

function tail(log: string): string {
  try {
    return readFileSync(join(workdir, log), "utf8").slice(-3000);
  } catch {
    return "";
  }
}

async function ready(url: string, log: string, init?: RequestInit): Promise<void> {
  try {
    await eventually(async () => (await fetch(url, init)).ok, READY_WITHIN_MS, url);
  } catch (e) {
    throw new Error(`${(e as Error).message}\n${tail(log)}`);
  }
}

export interface Etcd {
  url: string;
  revoke(leaseId: string): Promise<void>;
}

/** One etcd member on free ports. */
export async function startEtcd(): Promise<Etcd> {
  const [client, peer] = [await freePort(), await freePort()];
  const url = `http://127.0.0.1:${client}`;
  const peerUrl = `http://127.0.0.1:${peer}`;
  start(
    process.env.ETCD_BIN ?? "etcd",
    ["--name", "m0", "--data-dir", join(workdir, "etcd"), "--listen-client-urls", url, "--advertise-client-urls", url,
      "--listen-peer-urls", peerUrl, "--initial-advertise-peer-urls", peerUrl, "--initial-cluster", `m0=${peerUrl}`,
      "--initial-cluster-state", "new", "--log-level", "warn"],
    "etcd.log",
  );
  await ready(`${url}/health`, "etcd.log");
  return {
    url,
    async revoke(leaseId) {
      const r = await fetch(`${url}/v3/lease/revoke`, { method: "POST", body: JSON.stringify({ ID: leaseId }) });
      if (!r.ok) throw new Error(`revoke: ${r.status}`);
    },
  };
}

/** The key file the proxy mints with and the gateway verifies with. */
export const keyFile = join(workdir, "fencing.key");
writeFileSync(keyFile, `k1 ${randomBytes(32).toString("base64url")}\n`);

export interface Proxy {
  url: string;
  process: ChildProcess;
}

let proxies = 0;

/** A lease-proxy on a free port in front of `etcd`, with `extra` flags. */
export async function startProxy(etcd: Etcd, extra: string[] = [], scheme = "http", init?: RequestInit): Promise<Proxy> {
  const n = proxies++;
  const port = await freePort();
  const log = `proxy-${n}.log`;
  const child = start(
    binary("LEASE_PROXY_BIN", "lease-proxy"),
    ["--listen", `127.0.0.1:${port}`, "--etcd-endpoints", etcd.url, "--etcd-prefix", "/lease-proxy-ts/",
      "--key-file", keyFile, "--data-dir", join(workdir, `proxy-${n}`), ...extra],
    log,
  );
  const url = `${scheme}://127.0.0.1:${port}`;
  await ready(`${url}/readyz`, log, init);
  return { url, process: child };
}

/** A resource name no other test uses. */
export function unique(prefix = "ts"): string {
  return `${prefix}-${randomBytes(6).toString("hex")}`;
}

/** Polls a plain acquire (no wait) of `resource` until it wins; the grant's JSON. */
export async function takeOver(proxy: string, resource: string, holder: string, ttlSeconds: number, withinMs: number) {
  return eventually(
    async () => {
      const r = await fetch(`${proxy}/v1/leases/${resource}`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ holder, ttl_seconds: ttlSeconds }),
      });
      if (r.status === 201) return (await r.json()) as { token: string; fencing_token: string; secret: string };
      if (r.status !== 409) throw new Error(`take over: ${r.status} ${await r.text()}`);
      return undefined;
    },
    withinMs,
    `take over ${resource}`,
  );
}

/**
 * A TCP relay in front of `port`: with `dropFirst` the first connection's first answer is not
 * passed on and the connection is closed (the request was acted on; its answer is lost).
 */
export async function relay(port: number, dropFirst = false): Promise<{ url: string; connections: number; close(): void }> {
  let drop = dropFirst;
  const sockets: Socket[] = [];
  const state = { url: "", connections: 0, close: () => {} };
  const server = createServer((down) => {
    state.connections++;
    const dropThis = drop;
    drop = false;
    const up = connect(port, "127.0.0.1");
    sockets.push(down, up);
    down.pipe(up);
    up.on("data", (chunk) => {
      if (dropThis) {
        down.destroy();
        up.destroy();
      } else down.write(chunk);
    });
    up.on("end", () => down.end());
    for (const s of [up, down]) s.on("error", () => {});
    down.on("close", () => up.destroy());
    up.on("close", () => down.destroy());
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const address = server.address();
  state.url = `http://127.0.0.1:${typeof address === "object" && address ? address.port : 0}`;
  state.close = () => {
    server.close();
    for (const s of sockets) s.destroy();
  };
  return state;
}

/** The warehouse inventory (SQLite) behind fence-gateway in path mode (`/aisles/{resource}`). */
export async function startWarehouse(): Promise<{ inventory: string; gateway: string }> {
  const inventory = `http://127.0.0.1:${await freePort()}`;
  const gateway = `http://127.0.0.1:${await freePort()}`;
  start(binary("WAREHOUSE_BIN", "warehouse"), ["inventory", "--listen", inventory.slice(7), "--db", `sqlite:${workdir}/inventory.db`], "inventory.log");
  await ready(`${inventory}/log`, "inventory.log");
  start(
    binary("FENCE_GATEWAY_BIN", "fence-gateway"),
    ["--listen", gateway.slice(7), "--upstream", inventory, "--store", `sqlite:${workdir}/marks.db`, "--key-file", keyFile,
      "--resource-path", "/aisles/{resource}", "--write-grace", "2s"],
    "gateway.log",
  );
  await ready(`${gateway}/readyz`, "gateway.log");
  return { inventory, gateway };
}
