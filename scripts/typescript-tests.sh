#!/usr/bin/env bash
# The TypeScript SDK's tests (sdk/typescript/test, the robot example's included), with node's
# test runner, against a real etcd and real binaries that the tests start on free loopback ports:
# builds lease-proxy, fence-gateway, the warehouse inventory and dev-pki (unless the *_BIN
# variables name binaries already built), installs the package's pinned development tree
# (sdk/typescript/package-lock.json: typescript, @types/node, pg) with `npm ci` into
# target/ts-sdk — again only when the lock file changed, so the checkout stays clean — copies the
# sources beside it, type-checks and compiles them with tsc, and runs `node --test`.
# PostgreSQL (ensure_postgres) serves the in-database fencing test.
# Arguments are test files to run instead of all (e.g. `test/hostile.test.ts`).
# NODE names the node to run (default /usr/bin/node: Debian bookworm's is 18.20, NodeSource's 20).
# TS_BUILD_ONLY=1 stops after compiling (scripts/sdk-scenario.sh runs examples/scenario.ts so).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
ensure_deps
ensure_postgres
ensure_node
node="${NODE:-/usr/bin/node}"
# What the SDK and its tests use of Node: a global fetch and AbortSignal.timeout (Node 18),
# and node:test's describe and hooks (18.8).
"$node" -e 'const t = require("node:test");
  process.exit(typeof fetch === "function" && typeof AbortSignal.timeout === "function" &&
    typeof t.describe === "function" && typeof t.before === "function" ? 0 : 1)' || {
  echo "$node is $("$node" --version 2>&1): the TypeScript SDK needs a global fetch, AbortSignal.timeout and node:test's describe (Node 18.8 or later)" >&2
  exit 1
}

ensure_binaries

dir="$PWD/target/ts-sdk"
lock=sdk/typescript/package-lock.json
if ! cmp -s "$lock" "$dir/package-lock.json" || [ ! -x "$dir/node_modules/.bin/tsc" ]; then
  echo "==> installing the TypeScript SDK's development tree (pinned by $lock) into $dir"
  rm -rf "$dir"
  mkdir -p "$dir"
  cp sdk/typescript/package.json "$lock" "$dir/"
  (cd "$dir" && /usr/bin/npm ci --ignore-scripts --no-audit --no-fund --loglevel=error)
fi

echo "==> tsc"
rm -rf "$dir/src" "$dir/test" "$dir/examples" "$dir/build"
cp -r sdk/typescript/src sdk/typescript/test sdk/typescript/examples sdk/typescript/tsconfig.json \
  sdk/typescript/tsconfig.test.json "$dir/"
(cd "$dir" && "$node" node_modules/typescript/bin/tsc -p tsconfig.test.json --outDir build)
[ "${TS_BUILD_ONLY:-0}" = 1 ] && exit 0

tests=()
for t in "${@:-}"; do
  [ -n "$t" ] && tests+=("$dir/build/${t%.ts}.js")
done
[ ${#tests[@]} -gt 0 ] || tests=("$dir"/build/test/*.test.js)

export REPO_ROOT="$PWD"
echo "==> node --test ($("$node" --version))"
# Two files at a time (Node 18.19 and later; before, one at a time: slower, the same tests).
concurrency=()
"$node" --test-concurrency=2 -e '' 2>/dev/null && concurrency=(--test-concurrency=2)
"$node" --test "${concurrency[@]}" "${tests[@]}"
