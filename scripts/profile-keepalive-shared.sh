#!/usr/bin/env bash
# Samples lease-proxy's CPU (perf, DWARF call graphs) while leasebench renews leases over one
# shared gRPC KeepAlive stream at 64 in flight: one etcd and one release proxy on loopback, as
# scripts/profile.sh does for the HTTP operations. Writes perf.data to OUT (default
# profile-results/keepalive-shared.data); read it with `perf report --children`. Figures in
# docs/benchmarks/grpc-cpu.md ("Where a shared-stream renewal's CPU goes").
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-profile-results}
mkdir -p "$OUT"
cargo build --release --locked -p lease-proxy -p lease-proxy-benches
work=$(mktemp -d)
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
client=$(free_port); peer=$(free_port); listen=$(free_port)
etcd --name profile --data-dir "$work/etcd" \
    --listen-client-urls "http://127.0.0.1:$client" --advertise-client-urls "http://127.0.0.1:$client" \
    --listen-peer-urls "http://127.0.0.1:$peer" --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
    --initial-cluster "profile=http://127.0.0.1:$peer" --logger zap --log-level warn >"$work/etcd.log" 2>&1 &
epid=$!
RUST_LOG=error target/release/lease-proxy --listen "127.0.0.1:$listen" \
    --etcd-endpoints "http://127.0.0.1:$client" --data-dir "$work/proxy" >"$work/proxy.log" 2>&1 &
proxy=$!
trap 'kill $proxy $epid 2>/dev/null; wait 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$listen/readyz" >/dev/null && break; sleep 0.1; done
perf record -q -F 1999 --call-graph dwarf,16384 -p "$proxy" -o "$OUT/keepalive-shared.data" &
pp=$!
sleep 1
target/release/leasebench --etcd "http://127.0.0.1:$client" --proxy "http://127.0.0.1:$listen" \
    --proxy-pid "$proxy" --op grpc-keepalive-shared --concurrency 64 --rounds 1 --ops 300000 --held 200
kill -INT $pp; wait $pp || true
