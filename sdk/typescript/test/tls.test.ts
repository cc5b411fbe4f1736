/**
 * TLS and bearer tokens: a lease-proxy with --tls-cert, --tls-client-ca and --auth-tokens, its
 * certificates made by the workspace's dev-pki. Node 20's fetch takes no CA option: the client's
 * `tls` option builds an Agent of the undici that Node bundles.
 */

import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { createHash, randomBytes } from "node:crypto";
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { before, test } from "node:test";

import { Client, ProblemError, TransportError } from "../src/index.js";
import { binary, startEtcd, startProxy, unique, workdir } from "./harness.js";

let url: string;
let ca: string;
const token = randomBytes(24).toString("hex");
const pki = join(workdir, "pki");

before(async () => {
  const made = spawnSync(binary("DEV_PKI_BIN", "dev-pki"), [pki], { encoding: "utf8" });
  assert.equal(made.status, 0, made.stderr);
  ca = made.stdout.trim();
  const tokens = join(workdir, "tokens");
  const hash = createHash("sha256").update(token).digest("hex");
  writeFileSync(tokens, `robots ${hash} acquire:ts-,read:*\noperator cert acquire:*,read:*\n`);
  const proxy = await startProxy(
    await startEtcd(),
    ["--tls-cert", join(pki, "proxy.pem"), "--tls-key", join(pki, "proxy.key"), "--tls-client-ca", ca, "--auth-tokens", tokens],
    "https",
    { dispatcher: await dispatcherFor(ca) } as RequestInit,
  );
  url = proxy.url;
});

/** The Agent the client builds for `tls`, for the harness's own readiness probe. */
async function dispatcherFor(caFile: string): Promise<unknown> {
  await (await fetch("data:,")).arrayBuffer();
  const Agent = (globalThis as Record<symbol, { constructor: new (o: unknown) => unknown }>)[Symbol.for("undici.globalDispatcher.1")].constructor;
  return new Agent({ connect: { ca: readFileSync(caFile) } });
}

test("a bearer token over TLS with a private CA", async () => {
  const client = new Client(url, { tls: { ca }, token });
  const resource = unique("ts");
  await client.using(resource, { holder: "robot", ttlSeconds: 5 }, async (lease) => {
    assert.equal((await client.get(resource))?.token, lease.token);
  });
  await assert.rejects(client.acquire(unique("other"), { holder: "robot", ttlSeconds: 5 }), (e: unknown) =>
    e instanceof ProblemError && e.status === 403 && e.slug === "forbidden");
});

test("no token is refused, and Node's own roots do not trust the private CA", async () => {
  await assert.rejects(new Client(url, { tls: { ca } }).acquire(unique(), { holder: "a", ttlSeconds: 5 }), (e: unknown) =>
    e instanceof ProblemError && e.status === 401 && e.slug === "unauthenticated");
  await assert.rejects(new Client(url, { token }).get(unique()), TransportError);
});

test("a client certificate names the principal", async () => {
  const client = new Client(url, { tls: { ca, cert: join(pki, "operator.pem"), key: join(pki, "operator.key") } });
  const resource = unique("any");
  await client.using(resource, { holder: "operator", ttlSeconds: 5 }, async () => {
    assert.equal((await client.get(resource))?.holder, "operator");
  });
});
