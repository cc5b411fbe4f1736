#!/usr/bin/env bash
# Reproduces the proxy's CPU profiles in docs/benchmarks/proxy-cpu-profile.md ("Where a
# renewal's and a session acquire's CPU goes"): starts one etcd and one release lease-proxy on loopback, runs
# leasebench against them (`--etcd`/`--proxy`) while `perf record` samples the proxy alone, and
# writes for each workload a flame graph (SVG), the folded stacks, the share of the proxy's CPU
# per task kind, and leasebench's JSON; for renew at 1 in flight also the scheduler's wake-up
# delays of every thread (`perf sched latency`) over a separate, unsampled run.
#
# Needs perf (Debian: linux-perf) and inferno (`cargo install inferno`), root or
# kernel.perf_event_paranoid <= 1. Sampling costs CPU on the same cores: read throughput from
# the benchmarks, not from these runs. Takes about 4 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-profile-results}
for tool in perf etcd inferno-collapse-perf inferno-flamegraph; do
    command -v "$tool" >/dev/null || { echo "profile.sh: $tool is not on PATH" >&2; exit 1; }
done
cargo build --release --locked -p lease-proxy -p lease-proxy-benches
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
work=$(mktemp -d)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
client=$(free_port); peer=$(free_port); listen=$(free_port)
etcd --name profile --data-dir "$work/etcd" \
    --listen-client-urls "http://127.0.0.1:$client" --advertise-client-urls "http://127.0.0.1:$client" \
    --listen-peer-urls "http://127.0.0.1:$peer" --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
    --initial-cluster "profile=http://127.0.0.1:$peer" --logger zap --log-level warn \
    >"$work/etcd.log" 2>&1 &
pids+=($!)
RUST_LOG=error target/release/lease-proxy --listen "127.0.0.1:$listen" \
    --etcd-endpoints "http://127.0.0.1:$client" --data-dir "$work/proxy" >"$work/proxy.log" 2>&1 &
proxy=$!
pids+=("$proxy")
for _ in $(seq 100); do
    curl -sf "http://127.0.0.1:$listen/readyz" >/dev/null && break
    sleep 0.1
done
curl -sf "http://127.0.0.1:$listen/readyz" >/dev/null || { echo "profile.sh: the proxy did not become ready" >&2; exit 1; }

bench() { # op in-flight ops [leasebench args…]
    local op=$1 c=$2 n=$3
    shift 3
    target/release/leasebench --etcd "http://127.0.0.1:$client" --proxy "http://127.0.0.1:$listen" \
        --proxy-pid "$proxy" --op "$op" --concurrency "$c" --rounds 1 --ops "$n" --held 200 "$@"
}

profile() { # name op in-flight ops
    local name=$1
    perf record -q -F 2999 --call-graph dwarf,16384 -p "$proxy" -o "$work/$name.data" &
    local perf_pid=$!
    sleep 1
    bench "$2" "$3" "$4" --json "$OUT/$name.json" | tee "$OUT/$name.md"
    kill -INT "$perf_pid"
    wait "$perf_pid" || true
    perf script -i "$work/$name.data" 2>/dev/null | inferno-collapse-perf >"$OUT/$name.folded"
    inferno-flamegraph --title "lease-proxy during leasebench $2 at $3 in flight" --width 1600 --minwidth 0.1 \
        <"$OUT/$name.folded" >"$OUT/$name-flame.svg"
    python3 scripts/profile-tasks.py "$OUT/$name.folded" | tee "$OUT/$name-tasks.txt"
}

profile renew1 renew 1 20000
profile renew64 renew 64 40000
profile session-acquire64 session-acquire 64 30000

# Wake-up delays (time from being woken to running) per thread, renew at 1 in flight.
perf sched record -q -o "$work/sched.data" -- sleep 7 &
sched_pid=$!
sleep 0.5
bench renew 1 8000 >/dev/null
wait "$sched_pid" || true
perf sched latency -i "$work/sched.data" --sort avg >"$work/latency.txt" 2>/dev/null
head -12 "$work/latency.txt" | tee "$OUT/renew1-wakeups.txt"
echo "results in $OUT/"
