#!/usr/bin/env bash
# The whole stack on localhost: etcd, lease-proxy, fence-gateway, the inventory service, and the
# warehouse: robots leasing aisles under chaos, then an audit of the inventory's write log.
#   ./scripts/run.sh          run the demo, then keep the stack serving (Ctrl-C stops it)
#   ./scripts/run.sh --once   run the demo and exit with the audit's status (also LEASE_PROXY_DEMO_ONCE=1)
#   WAREHOUSE_DURATION=60s    how long the robots work (default 30s)
#   WAREHOUSE_DB=postgres://… the inventory on PostgreSQL instead of SQLite
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh

once="${LEASE_PROXY_DEMO_ONCE:-0}"
for arg in "$@"; do
  case "$arg" in
    --once) once=1 ;;
    *) echo "usage: $0 [--once]" >&2; exit 64 ;;
  esac
done

ensure_deps
echo "==> building"
cargo build --locked -q -p lease-proxy -p fencing -p lease-proxy-examples
bin=target/debug

work=$(mktemp -d -t lease-proxy-demo-XXXXXX)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

etcd_url=http://127.0.0.1:2379
if curl -fsS "$etcd_url/health" >/dev/null 2>&1; then
  echo "==> using the etcd already serving on $etcd_url"
else
  echo "==> starting etcd on $etcd_url (data in $work)"
  etcd --data-dir "$work/etcd" --listen-client-urls "$etcd_url" --advertise-client-urls "$etcd_url" \
    --listen-peer-urls http://127.0.0.1:2380 --logger zap --log-level warn >"$work/etcd.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 100); do curl -fsS "$etcd_url/health" >/dev/null 2>&1 && break; sleep 0.1; done
fi

proxy=http://127.0.0.1:7070
gateway=http://127.0.0.1:7071
inventory=http://127.0.0.1:8080
wait_for() { for _ in $(seq 100); do curl -fsS "$1" >/dev/null 2>&1 && return 0; sleep 0.1; done; echo "$1 did not come up" >&2; exit 1; }

echo "==> starting lease-proxy on $proxy (forwarding to and pre-fencing fence-gateway)"
"$bin/lease-proxy" --listen 127.0.0.1:7070 --etcd-endpoints "$etcd_url" --data-dir "$work/proxy" \
  --upstream "$gateway" --prefence-url "$gateway" >"$work/proxy.log" 2>&1 &
pids+=($!)
wait_for "$proxy/readyz"
keys="$work/proxy/dev-fencing.key"

echo "==> starting the inventory service on $inventory (SQLite) behind fence-gateway on $gateway"
# Path mode: the aisle in /aisles/{aisle}/… is the resource fenced, so a token for one aisle can
# never write another; non-canonical paths (.., %2e, //, …) are refused.
"$bin/warehouse" inventory --listen 127.0.0.1:8080 --db "${WAREHOUSE_DB:-sqlite:$work/inventory.db}" >"$work/inventory.log" 2>&1 &
pids+=($!)
"$bin/fence-gateway" --listen 127.0.0.1:7071 --upstream "$inventory" --store "sqlite:$work/marks.db" \
  --key-file "$keys" --resource-path '/aisles/{resource}' --write-grace 2s >"$work/gateway.log" 2>&1 &
pids+=($!)
wait_for "$gateway/readyz"

echo
echo "==> a lease, granted:"
curl -sS -X POST "$proxy/v1/leases/demo-aisle" -H 'content-type: application/json' \
  -d '{"holder":"curl","ttl_seconds":10}'
echo; echo

duration="${WAREHOUSE_DURATION:-30s}"
echo "==> the warehouse: robots lease aisles, count, crash (SIGKILL) and stall (SIGSTOP past the TTL)"
status=0
"$bin/warehouse" run --proxy "$proxy" --gateway "$gateway" --inventory "$inventory" \
  --robots 6 --aisles 4 --ttl 3 --duration "$duration" --chaos || status=$?
echo

if [ "$once" = 1 ]; then
  echo "==> demo done (--once)"
  exit "$status"
fi
cat <<EOT
==> the stack keeps serving; try (Ctrl-C stops everything):
  curl -s -X POST $proxy/v1/leases/my-job -H 'content-type: application/json' -d '{"holder":"me","ttl_seconds":20}'
  curl -s -X PUT $proxy/v1/leases/my-job/forward/aisles/my-job/count -H 'lease-secret: SECRET' -H 'content-type: application/json' -d '{"robot":"me","count":7}'
  curl -s -X POST $proxy/v1/leases/my-job/renew -H 'lease-secret: SECRET'
  curl -s $proxy/v1/leases/my-job
  curl -s '$proxy/v1/leases?prefix=aisle-'
  curl -s -X DELETE $proxy/v1/leases/my-job -H 'lease-secret: SECRET'
  curl -s $inventory/log          # the inventory's write log (what the audit reads)
  curl -s $gateway/metrics        # the enforcer's counts
EOT
wait
