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
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
ensure_deps
ensure_postgres
ensure_node
# AbortSignal.any, which the SDK uses to combine its signals, came in Node 20.3.
/usr/bin/node -e 'const [a, b] = process.versions.node.split(".").map(Number); process.exit(a > 20 || (a === 20 && b >= 3) ? 0 : 1)' || {
  echo "/usr/bin/node is $(/usr/bin/node --version 2>&1); the TypeScript SDK needs 20.3 or later" >&2
  exit 1
}

bin="${CARGO_TARGET_DIR:-$PWD/target}/debug"
if [ -z "${LEASE_PROXY_BIN:-}" ]; then
  echo "==> building lease-proxy, fence-gateway, the warehouse example and dev-pki"
  cargo build --locked -q -p lease-proxy --bin lease-proxy
  cargo build --locked -q -p fencing --bin fence-gateway
  cargo build --locked -q -p lease-proxy-examples --bin warehouse --bin dev-pki
fi

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
(cd "$dir" && node_modules/.bin/tsc -p tsconfig.test.json --outDir build)

tests=()
for t in "${@:-}"; do
  [ -n "$t" ] && tests+=("$dir/build/${t%.ts}.js")
done
[ ${#tests[@]} -gt 0 ] || tests=("$dir"/build/test/*.test.js)

echo "==> node --test"
REPO_ROOT="$PWD" \
  LEASE_PROXY_BIN="${LEASE_PROXY_BIN:-$bin/lease-proxy}" FENCE_GATEWAY_BIN="${FENCE_GATEWAY_BIN:-$bin/fence-gateway}" \
  WAREHOUSE_BIN="${WAREHOUSE_BIN:-$bin/warehouse}" DEV_PKI_BIN="${DEV_PKI_BIN:-$bin/dev-pki}" \
  node --test --test-concurrency=2 "${tests[@]}"
