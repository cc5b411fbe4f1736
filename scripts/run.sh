#!/usr/bin/env bash
# The whole stack on localhost: etcd, lease-proxy, and a demo of workers contending for a
# resource, one of them crashing and another taking over with a higher fencing token.
#   ./scripts/run.sh          run the demo, then keep the stack serving (Ctrl-C stops it)
#   ./scripts/run.sh --once   run the demo and exit (also LEASE_PROXY_DEMO_ONCE=1)
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
cargo build --locked -q -p lease-proxy -p lease-proxy-examples
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
echo "==> starting lease-proxy on $proxy"
"$bin/lease-proxy" --listen 127.0.0.1:7070 --etcd-endpoints "$etcd_url" \
  --data-dir "$work/proxy" >"$work/proxy.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do curl -fsS "$proxy/readyz" >/dev/null 2>&1 && break; sleep 0.1; done
curl -fsS "$proxy/readyz" >/dev/null || { cat "$work/proxy.log"; exit 1; }

echo
echo "==> a lease, granted:"
curl -sS -X POST "$proxy/v1/leases/demo-aisle" -H 'content-type: application/json' \
  -d '{"holder":"curl","ttl_seconds":10}'
echo; echo

echo "==> three workers contend for aisle-1 (TTL 4 s, renewing every TTL/3)"
declare -A worker_pid
for name in robot-a robot-b robot-c; do
  "$bin/worker" --proxy "$proxy" --resource aisle-1 --name "$name" --ttl 4 &
  worker_pid[$name]=$!
  pids+=($!)
  sleep 0.3
done
sleep 3
holder=$(curl -fsS "$proxy/v1/leases/aisle-1" | sed -E 's/.*"holder":"([^"]+)".*/\1/')
echo "==> current holder: $holder — crashing it with SIGKILL (no release, the lease must lapse)"
{ kill -9 "${worker_pid[$holder]}" && wait "${worker_pid[$holder]}"; } 2>/dev/null || true
sleep 7
echo "==> after the crash:"
curl -fsS "$proxy/v1/leases/aisle-1"; echo
next=$(curl -fsS "$proxy/v1/leases/aisle-1" | sed -E 's/.*"holder":"([^"]+)".*/\1/')
echo "==> stopping $next gracefully (SIGTERM releases at once)"
kill -TERM "${worker_pid[$next]}"
sleep 1.5
echo "==> after the graceful stop:"
curl -fsS "$proxy/v1/leases/aisle-1"; echo
echo

if [ "$once" = 1 ]; then
  echo "==> demo done (--once)"
  exit 0
fi
cat <<EOT
==> the stack keeps serving; try (Ctrl-C stops everything):
  curl -s -X POST $proxy/v1/leases/my-job -H 'content-type: application/json' -d '{"holder":"me","ttl_seconds":20}'
  curl -s -X POST $proxy/v1/leases/my-job/renew -H 'lease-secret: SECRET'
  curl -s $proxy/v1/leases/my-job
  curl -s '$proxy/v1/leases?prefix=aisle-'
  curl -s -X DELETE $proxy/v1/leases/my-job -H 'lease-secret: SECRET'
EOT
wait
