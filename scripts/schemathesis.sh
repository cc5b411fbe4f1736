#!/usr/bin/env bash
# Property-based tests of the HTTP APIs against their own OpenAPI documents, with schemathesis:
# builds lease-proxy, fence-gateway and the warehouse inventory (scripts/deps.sh ensure_binaries:
# unless LEASE_PROXY_BIN and the others name them built), starts etcd, the inventory,
# fence-gateway in front of it and lease-proxy forwarding to the gateway (free loopback ports, a
# temporary directory), then runs schemathesis on each binary's /openapi.json — every phase:
# examples, coverage, fuzzing, and stateful sequences along the documents' links (acquire →
# renew → release and forward with the grant's secret in Lease-Secret; open → keepalive → close
# for sessions) — with every check. Fails on any server error, any answer the document does not
# describe (status, content type, headers, schema), any schema-valid request refused or invalid
# one accepted. Stops everything it started.
#   SCHEMATHESIS_EXAMPLES=N   test cases per operation and phase (default 25)
#   SCHEMATHESIS_MAX_TIME=S   time budget of each of the two runs, in seconds (default 100 and 30)
#   SCHEMATHESIS_SEED=N       replay a run (each run prints its seed)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
ensure_deps
ensure_python

schemathesis_version=4.32.5
examples="${SCHEMATHESIS_EXAMPLES:-25}"
seed=()
[ -n "${SCHEMATHESIS_SEED:-}" ] && seed=(--seed "$SCHEMATHESIS_SEED")

ensure_binaries

# A virtual environment of its own: the Python SDK's tests install theirs into target/venv, and the
# two may run at once (scripts/test.sh).
venv=target/venv-schemathesis
if [ ! -x "$venv/bin/python" ]; then
  echo "==> creating $venv"
  python3 -m venv "$venv"
fi
if [ "$("$venv/bin/python" -m pip show schemathesis 2>/dev/null | sed -n 's/^Version: //p')" != "$schemathesis_version" ]; then
  echo "==> installing schemathesis $schemathesis_version into $venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "schemathesis==$schemathesis_version"
fi
config="$PWD/scripts/schemathesis.toml"
# Through the venv's python, not its `st` script, whose first line names the path the venv was
# made at (a venv under a moved or copied checkout would fail with "required file not found").
st=("$PWD/$venv/bin/python" -c 'import sys; from schemathesis.cli import schemathesis; sys.argv[0] = "st"; sys.exit(schemathesis())')

work=$(mktemp -d -t lease-proxy-schemathesis-XXXXXX)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() { "$venv/bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
wait_for() {
  for _ in $(seq 150); do curl -fsS "$1" >/dev/null 2>&1 && return 0; sleep 0.1; done
  echo "$1 did not come up; logs in $work:" >&2
  tail -n 20 "$work"/*.log >&2
  exit 1
}

etcd_url="http://127.0.0.1:$(free_port)"
echo "==> starting etcd on $etcd_url"
etcd --data-dir "$work/etcd" --listen-client-urls "$etcd_url" --advertise-client-urls "$etcd_url" \
  --listen-peer-urls "http://127.0.0.1:$(free_port)" --logger zap --log-level warn >"$work/etcd.log" 2>&1 &
pids+=($!)
wait_for "$etcd_url/health"

proxy_port=$(free_port)
gateway_port=$(free_port)
inventory_port=$(free_port)
proxy="http://127.0.0.1:$proxy_port"
gateway="http://127.0.0.1:$gateway_port"
echo "==> starting lease-proxy on $proxy (forwarding to and pre-fencing fence-gateway on $gateway)"
# A short --max-wait keeps the waiting acquires schemathesis sends short.
"$LEASE_PROXY_BIN" --listen "127.0.0.1:$proxy_port" --etcd-endpoints "$etcd_url" --data-dir "$work/proxy" \
  --upstream "$gateway" --prefence-url "$gateway" --max-wait 1s >"$work/proxy.log" 2>&1 &
pids+=($!)
wait_for "$proxy/readyz"
echo "==> starting the warehouse inventory behind fence-gateway"
"$WAREHOUSE_BIN" inventory --listen "127.0.0.1:$inventory_port" --db "sqlite:$work/inventory.db" \
  >"$work/inventory.log" 2>&1 &
pids+=($!)
"$FENCE_GATEWAY_BIN" --listen "127.0.0.1:$gateway_port" --upstream "http://127.0.0.1:$inventory_port" \
  --store "sqlite:$work/marks.db" --key-file "$work/proxy/dev-fencing.key" --resource-path '/aisles/{resource}' \
  >"$work/gateway.log" 2>&1 &
pids+=($!)
wait_for "$gateway/readyz"

# Run from the work directory: schemathesis keeps its example database under the current one.
cd "$work"
status=0
echo "==> schemathesis: lease-proxy ($proxy/openapi.json)"
"${st[@]}" --config-file "$config" --no-color run "$proxy/openapi.json" \
  --max-examples "$examples" --max-time "${SCHEMATHESIS_MAX_TIME:-100}" "${seed[@]}" || status=1
echo "==> schemathesis: fence-gateway ($gateway/openapi.json)"
"${st[@]}" --config-file "$config" --no-color run "$gateway/openapi.json" \
  --max-examples "$examples" --max-time "${SCHEMATHESIS_MAX_TIME:-30}" "${seed[@]}" || status=1
if grep -qiE "panicked|handler panicked" "$work"/proxy.log "$work"/gateway.log; then
  echo "a binary panicked while under test:" >&2
  grep -iE -B2 -A5 "panicked" "$work"/proxy.log "$work"/gateway.log >&2
  status=1
fi
[ "$status" = 0 ] && echo "==> schemathesis: both APIs conform to their documents"
exit "$status"
