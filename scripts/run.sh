#!/usr/bin/env bash
# The whole stack on localhost: etcd, lease-proxy, fence-gateway, the inventory service, and the
# warehouse: a fleet of robots sharing the aisles under chaos and a rolling deploy, then an audit
# of the inventory's write log and of the fleet's coverage.
#   ./scripts/run.sh          run the demo, then keep the stack serving (Ctrl-C stops it)
#   ./scripts/run.sh --once   run the demo and exit with the audit's status (also LEASE_PROXY_DEMO_ONCE=1)
#   ./scripts/run.sh --secure the same stack with TLS on every hop and authentication on: etcd
#                             over TLS with client certificates and its auth enabled (port 2479),
#                             HTTPS on lease-proxy, fence-gateway and the inventory, bearer tokens
#                             and client certificates as principals, pre-fences only from the
#                             proxy's certificate; certificates generated for the run (dev-pki)
#   WAREHOUSE_DURATION=60s    how long the robots work (default 40s)
#   WAREHOUSE_DB=postgres://… the inventory on PostgreSQL instead of SQLite
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh

once="${LEASE_PROXY_DEMO_ONCE:-0}"
secure=0
for arg in "$@"; do
  case "$arg" in
    --once) once=1 ;;
    --secure) secure=1 ;;
    *) echo "usage: $0 [--once] [--secure]" >&2; exit 64 ;;
  esac
done

ensure_deps
echo "==> building"
cargo build --locked -q -p lease-proxy -p fencing --features fencing/server -p lease-proxy-examples
bin="${CARGO_TARGET_DIR:-target}/debug"

work=$(mktemp -d -t lease-proxy-demo-XXXXXX)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

wait_for() { for _ in $(seq 100); do curl "${tls_curl[@]}" -fsS "$1" >/dev/null 2>&1 && return 0; sleep 0.1; done; echo "$1 did not come up" >&2; exit 1; }

tls_curl=()
proxy_tls=()
gateway_tls=()
inventory_tls=()
robot_access=()
if [ "$secure" = 1 ]; then
  pki="$work/pki"
  ca=$("$bin/dev-pki" "$pki")
  echo "==> certificates for this run in $pki (CA $ca)"
  tls_curl=(--cacert "$ca")
  etcd_url=https://127.0.0.1:2479
  echo "==> starting etcd on $etcd_url: TLS, client certificates required, then auth enabled"
  etcd --data-dir "$work/etcd" --listen-client-urls "$etcd_url" --advertise-client-urls "$etcd_url" \
    --listen-peer-urls http://127.0.0.1:2480 --cert-file "$pki/etcd.pem" --key-file "$pki/etcd.key" \
    --trusted-ca-file "$ca" --client-cert-auth --logger zap --log-level warn >"$work/etcd.log" 2>&1 &
  pids+=($!)
  etcd_curl=(curl -fsS --cacert "$ca" --cert "$pki/proxy-etcd.pem" --key "$pki/proxy-etcd.key")
  for _ in $(seq 100); do "${etcd_curl[@]}" "$etcd_url/health" >/dev/null 2>&1 && break; sleep 0.1; done
  head -c 18 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$work/etcd-password"
  password=$(cat "$work/etcd-password")
  # etcd's JSON gateway: the root user (etcd's own root role), then authentication on.
  "${etcd_curl[@]}" -X POST "$etcd_url/v3/auth/user/add" -d "{\"name\":\"root\",\"password\":\"$password\"}" >/dev/null
  "${etcd_curl[@]}" -X POST "$etcd_url/v3/auth/user/grant" -d '{"user":"root","role":"root"}' >/dev/null
  "${etcd_curl[@]}" -X POST "$etcd_url/v3/auth/enable" -d '{}' >/dev/null
  # A bearer token for the robots (only its SHA-256 is in the token file), and the operator's
  # client certificate as a second principal.
  token=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
  printf '%s\n' \
    "robots $(printf %s "$token" | sha256sum | cut -d' ' -f1) acquire:aisle-,forward:aisle-,read:*" \
    "operator cert acquire:*,forward:*,read:*" >"$work/tokens"
  proxy=https://127.0.0.1:7070
  gateway=https://127.0.0.1:7071
  inventory=https://127.0.0.1:8080
  proxy_tls=(--tls-cert "$pki/proxy.pem" --tls-key "$pki/proxy.key" --tls-client-ca "$ca"
    --auth-tokens "$work/tokens" --audit-log "$work/audit.jsonl"
    --etcd-ca "$ca" --etcd-cert "$pki/proxy-etcd.pem" --etcd-key "$pki/proxy-etcd.key"
    --etcd-user root --etcd-password-file "$work/etcd-password"
    --upstream-ca "$ca" --upstream-cert "$pki/proxy-client.pem" --upstream-key "$pki/proxy-client.key")
  gateway_tls=(--tls-cert "$pki/gateway.pem" --tls-key "$pki/gateway.key" --tls-client-ca "$ca"
    --fence-principals lease-proxy --upstream-ca "$ca")
  inventory_tls=(--tls-cert "$pki/inventory.pem" --tls-key "$pki/inventory.key")
  robot_access=(--ca "$ca")
  export WAREHOUSE_TOKEN="$token"
else
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
fi

echo "==> starting lease-proxy on $proxy (forwarding to and pre-fencing fence-gateway)"
"$bin/lease-proxy" --listen 127.0.0.1:7070 --etcd-endpoints "$etcd_url" --data-dir "$work/proxy" \
  --upstream "$gateway" --prefence-url "$gateway" --ui-gateway "$gateway" "${proxy_tls[@]}" >"$work/proxy.log" 2>&1 &
pids+=($!)
wait_for "$proxy/readyz"
echo "==> the dashboard: $proxy/ui?fleet=aisles"
keys="$work/proxy/dev-fencing.key"

echo "==> starting the inventory service on $inventory (SQLite) behind fence-gateway on $gateway"
# Path mode: the aisle in /aisles/{aisle}/… is the resource fenced, so a token for one aisle can
# never write another; non-canonical paths (.., %2e, //, …) are refused.
"$bin/warehouse" inventory --listen 127.0.0.1:8080 --db "${WAREHOUSE_DB:-sqlite:$work/inventory.db}" \
  "${inventory_tls[@]}" >"$work/inventory.log" 2>&1 &
pids+=($!)
"$bin/fence-gateway" --listen 127.0.0.1:7071 --upstream "$inventory" --store "sqlite:$work/marks.db" \
  --key-file "$keys" --resource-path '/aisles/{resource}' --write-grace 2s "${gateway_tls[@]}" \
  >"$work/gateway.log" 2>&1 &
pids+=($!)
wait_for "$gateway/readyz"

echo
if [ "$secure" = 1 ]; then
  echo "==> a lease, granted to the operator (the principal its client certificate names):"
  curl -sS "${tls_curl[@]}" --cert "$pki/operator.pem" --key "$pki/operator.key" \
    -X POST "$proxy/v1/leases/demo-aisle" -H 'content-type: application/json' \
    -d '{"holder":"curl","ttl_seconds":10}'
  echo
  echo "==> and refused without credentials:"
  curl -sS "${tls_curl[@]}" -X POST "$proxy/v1/leases/demo-aisle-2" -H 'content-type: application/json' \
    -d '{"holder":"curl","ttl_seconds":10}'
else
  echo "==> a lease, granted:"
  curl -sS -X POST "$proxy/v1/leases/demo-aisle" -H 'content-type: application/json' \
    -d '{"holder":"curl","ttl_seconds":10}'
fi
echo; echo

aisles=12
echo "==> the fleet \`aisles\`: $aisles aisles the service shares among the robots that join it"
fleet_auth=()
if [ "$secure" = 1 ]; then fleet_auth=(-H "authorization: Bearer $token"); fi
resources=$(seq -s, -f '"aisle-%g"' 1 "$aisles")
curl -sS "${tls_curl[@]}" "${fleet_auth[@]}" -X PUT "$proxy/v1/fleets/aisles" -H 'content-type: application/json' \
  -d "{\"resources\":[$resources],\"drain_ms\":2000}"
echo; echo

duration="${WAREHOUSE_DURATION:-40s}"
echo "==> the warehouse: robots join the fleet, count what they are given, crash (SIGKILL), stall"
echo "    (SIGSTOP past the TTL) and are redeployed one by one (drained, restarted) — $proxy/ui?fleet=aisles"
status=0
"$bin/warehouse" run --proxy "$proxy" --gateway "$gateway" --inventory "$inventory" \
  --robots 6 --aisles "$aisles" --fleet aisles --drain 2s --ttl 3 --duration "$duration" --chaos --deploy \
  "${robot_access[@]}" || status=$?
echo

if [ "$once" = 1 ]; then
  echo "==> demo done (--once)"
  exit "$status"
fi
c="curl -s"
if [ "$secure" = 1 ]; then
  c="curl -s --cacert $ca --cert $pki/operator.pem --key $pki/operator.key"
  echo "==> every hop is TLS; the operator's certificate authenticates these (audit log: $work/audit.jsonl)"
fi
cat <<EOT
==> the stack keeps serving; watch it at $proxy/ui?fleet=aisles, or try (Ctrl-C stops everything):
  $c -X POST $proxy/v1/leases/my-job -H 'content-type: application/json' -d '{"holder":"me","ttl_seconds":20}'
  $c -X PUT $proxy/v1/leases/my-job/forward/aisles/my-job/count -H 'lease-secret: SECRET' -H 'content-type: application/json' -d '{"robot":"me","count":7}'
  $c -X POST $proxy/v1/leases/my-job/renew -H 'lease-secret: SECRET'
  $c $proxy/v1/leases/my-job
  $c '$proxy/v1/leases?prefix=aisle-'
  $c -X DELETE $proxy/v1/leases/my-job -H 'lease-secret: SECRET'
  $c $proxy/v1/fleets/aisles          # the fleet: members, what each holds and hands off, what nobody holds
  $c -X POST $proxy/v1/fleets/aisles/members -H 'content-type: application/json' -d '{"member":"me","ttl_seconds":60}'
  $c "$proxy/v1/fleets/aisles/members/me?after=0&wait_ms=10000" -H 'lease-secret: SECRET'   # my share, with tokens
  $c -X POST $proxy/v1/fleets/aisles/members/me/drain -H 'lease-secret: SECRET'            # hand it all off
  $c $inventory/log          # the inventory's write log (what the audit reads)
  $c $gateway/metrics        # the enforcer's counts
EOT
wait
