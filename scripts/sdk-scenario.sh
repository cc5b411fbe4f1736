#!/usr/bin/env bash
# The same scripted scenario run by every SDK (docs/SDKS.md "One scenario, four SDKs"): starts
# etcd, the warehouse inventory behind fence-gateway and lease-proxy on free loopback ports, runs
# each SDK's runner against them (each with names of its own), keeps what each printed in
# target/sdk-scenario/SDK.txt, and compares the sequences.
#
#   scripts/sdk-scenario.sh           run, then write the table into docs/SDKS.md
#   scripts/sdk-scenario.sh --check   run, and fail unless every SDK printed the same sequence
#                                     and the table in docs/SDKS.md is what the runs give
#
# Binaries: LEASE_PROXY_BIN, FENCE_GATEWAY_BIN, WAREHOUSE_BIN, else built here (scripts/deps.sh
# ensure_binaries).
# The TypeScript runner is compiled by scripts/typescript-tests.sh (TS_BUILD_ONLY=1), the Go one
# by `go build`; NODE names the node to run it with (default /usr/bin/node). The Python runner
# runs in the virtual environment target/venv (made here, with the SDK installed, if missing).
# The Rust runner is the SDK's example `scenario`, built by cargo (into CARGO_TARGET_DIR, default
# target/).
set -euo pipefail
cd "$(dirname "$0")/.."
mode=write
case "${1:-}" in
  "") ;;
  --check) mode=check ;;
  *) echo "usage: $0 [--check]" >&2; exit 64 ;;
esac
source scripts/deps.sh
ensure_deps
ensure_go
ensure_node
ensure_python

ensure_binaries

out="$PWD/target/sdk-scenario"
rm -rf "$out"
mkdir -p "$out"
echo "==> building the runners"
(cd sdk/go && GOPROXY=off GOFLAGS=-mod=readonly /usr/bin/go build -o "$out/scenario-go" ./examples/scenario)
cargo build -q --locked -p lease-proxy-client --example scenario
rust_runner="${CARGO_TARGET_DIR:-$PWD/target}/debug/examples/scenario"
TS_BUILD_ONLY=1 scripts/typescript-tests.sh >/dev/null
node="${NODE:-/usr/bin/node}"
venv=target/venv
if ! "$venv/bin/python" -c 'import lease_proxy_client' 2>/dev/null; then
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "httpx==0.28.1" -e sdk/python
fi

work=$(mktemp -d -t sdk-scenario-XXXXXX)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
up() { for _ in $(seq 150); do curl -fsS "$1" >/dev/null 2>&1 && return 0; sleep 0.1; done; echo "$1 did not come up; logs in $work" >&2; tail -n 20 "$work"/*.log >&2; exit 1; }

echo "==> starting etcd, the inventory, fence-gateway and lease-proxy"
etcd_url="http://127.0.0.1:$(free_port)" peer="http://127.0.0.1:$(free_port)"
etcd --name m0 --data-dir "$work/etcd" --listen-client-urls "$etcd_url" --advertise-client-urls "$etcd_url" \
  --listen-peer-urls "$peer" --initial-advertise-peer-urls "$peer" --initial-cluster "m0=$peer" \
  --initial-cluster-state new --log-level warn >"$work/etcd.log" 2>&1 &
pids+=($!)
python3 -c 'import base64, os; print("k1", base64.urlsafe_b64encode(os.urandom(32)).decode().rstrip("="))' >"$work/fencing.key"
inventory="127.0.0.1:$(free_port)" gateway="127.0.0.1:$(free_port)" proxy="127.0.0.1:$(free_port)"
"$WAREHOUSE_BIN" inventory --listen "$inventory" --db "sqlite:$work/inventory.db" >"$work/inventory.log" 2>&1 &
pids+=($!)
up "$etcd_url/health"
up "http://$inventory/log"
"$FENCE_GATEWAY_BIN" --listen "$gateway" --upstream "http://$inventory" --store "sqlite:$work/marks.db" \
  --key-file "$work/fencing.key" --resource-path '/aisles/{resource}' --write-grace 2s >"$work/gateway.log" 2>&1 &
pids+=($!)
"$LEASE_PROXY_BIN" --listen "$proxy" --etcd-endpoints "$etcd_url" --etcd-prefix /sdk-scenario/ \
  --key-file "$work/fencing.key" --data-dir "$work/proxy" --upstream "http://$gateway" \
  --prefence-url "http://$gateway" >"$work/proxy.log" 2>&1 &
pids+=($!)
up "http://$gateway/readyz"
up "http://$proxy/readyz"

# One runner per SDK: the name, then the command (each gets --proxy, --gateway, --etcd, --prefix).
runners=(
  "go|$out/scenario-go"
  "typescript|$node $PWD/target/ts-sdk/build/examples/scenario.js"
  "python|$PWD/$venv/bin/python $PWD/sdk/python/examples/scenario.py"
  "rust|$rust_runner"
)
status=0
for entry in "${runners[@]}"; do
  sdk=${entry%%|*} command=${entry#*|}
  echo "==> $sdk"
  # shellcheck disable=SC2086 # the command is words on purpose
  if ! $command --proxy "http://$proxy" --gateway "http://$gateway" --etcd "$etcd_url" --prefix "$sdk-" >"$out/$sdk.txt"; then
    echo "the $sdk runner failed:" >&2
    cat "$out/$sdk.txt" >&2
    status=1
  fi
done
[ "$status" = 0 ] || exit "$status"
python3 scripts/sdk-scenario.py "--$mode" docs/SDKS.md "$out"
