/**
 * The scripted scenario every SDK runs (examples/scenario.ts) against a stack of its own,
 * compared with the table in docs/SDKS.md: this SDK observes what the table says every SDK
 * observes.
 */

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

import { ROOT, startEtcd, startProxy, startWarehouse } from "./harness.js";

/** The table's observed column as the runner prints it: KEY<TAB>OBSERVED lines. */
function documented(): string {
  let text = readFileSync(join(ROOT, "docs", "SDKS.md"), "utf8");
  text = text.slice(Math.max(0, text.indexOf("<!-- scenario-table:")));
  text = text.slice(0, text.indexOf("<!-- /scenario-table -->"));
  const rows = text.split("\n").filter((line) => line.startsWith("| `"));
  assert.ok(rows.length > 0, "no scenario table in docs/SDKS.md");
  return rows
    .map((line) => {
      const cells = line.replaceAll("\\|", "\0").split(" | ");
      return `${cells[0].replace(/^\| `|`$/g, "")}\t${cells[2].replaceAll("\0", "|")}\n`;
    })
    .join("");
}

test("the scenario observes what docs/SDKS.md says every SDK observes", async () => {
  const etcd = await startEtcd();
  const { gateway } = await startWarehouse();
  const proxy = await startProxy(etcd, ["--upstream", gateway, "--prefence-url", gateway]);
  const runner = fileURLToPath(new URL("../examples/scenario.js", import.meta.url));
  const child = spawn(process.execPath, [runner, "--proxy", proxy.url, "--gateway", gateway, "--etcd", etcd.url, "--prefix", "ts-"], {
    stdio: ["ignore", "pipe", "inherit"],
  });
  let got = "";
  child.stdout.on("data", (chunk: Buffer) => (got += chunk.toString()));
  const code = await new Promise((resolve) => child.on("exit", resolve));
  assert.equal(code, 0, got);
  assert.equal(got, documented(), "if the change is meant for every SDK, scripts/sdk-scenario.sh rewrites the table");
});
