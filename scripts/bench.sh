#!/usr/bin/env bash
# Reproduces docs/BENCHMARKS.md: builds release binaries, then runs leasebench against the peers
# a user would pick instead (etcd's grpc-proxy, etcd's JSON gateway, a bare pass-through: the
# first table, printed by scripts/peers-table.py), then leasebench again (every operation,
# then sessions and group commit, then sustained renewal of 1k/10k/100k held leases and of
# 100k resources under 1,000 sessions, then the cost of HTTPS and bearer tokens, then etcd's gRPC
# API through the proxy and straight to etcd with 1,000 gRPC watchers, then acquires with and
# without 1,000 idle /v1/watch streams),
# fencebench, pgfencebench (fencing inside PostgreSQL) and the criterion
# micro-benchmarks, writing tables, JSON and SVG charts to ${OUT:-bench-results}/.
# Needs etcd on PATH (Debian: etcd-server); takes about 60 minutes on 2 cores. The proxy's CPU
# profiles (flame graphs) are scripts/profile.sh's.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
ensure_deps
OUT=${OUT:-bench-results}
mkdir -p "$OUT"
cargo build --release --locked -p lease-proxy -p fencing --features fencing/server -p lease-proxy-benches
target/release/leasebench --peers \
    --op grpc-put,grpc-range,grpc-keepalive,grpc-keepalive-shared,grpc-lock,acquire,renew,lock \
    --concurrency 1,64 --rounds 2 --round-deadline 25s --json "$OUT/peers.json" | tee "$OUT/peers.md"
python3 scripts/peers-table.py "$OUT/peers.json" peers | tee "$OUT/peers-table.md"
target/release/leasebench --json "$OUT/leasebench.json" --chart "$OUT/leasebench.svg" | tee "$OUT/leasebench.md"
target/release/leasebench --op acquire,session-acquire --concurrency 1,64,256 \
    --unbatched --unbatched-in-flight 64 --json "$OUT/group-commit.json" | tee "$OUT/group-commit.md"
target/release/leasebench --op acquire,renew,session-acquire --concurrency 1,64,256 --h2c \
    --json "$OUT/h2c.json" | tee "$OUT/h2c.md"
target/release/leasebench --op renew --concurrency 1 --ops 100 --rounds 1 --held 10 \
    --sustain-sessions 1000 --per-session 100 --sustain-ttl 30 --sustain-for 60s \
    --json "$OUT/sustain-sessions.json" | tee "$OUT/sustain-sessions.md"
target/release/leasebench --op renew --concurrency 64 --rounds 1 --sustain 1000,10000,100000 \
    --json "$OUT/sustain.json" | tee "$OUT/sustain.md"
target/release/leasebench --secure --op acquire,renew --concurrency 1,8,64 --ops 1000 \
    --json "$OUT/auth-tls.json" | tee "$OUT/auth-tls.md"
target/release/leasebench --op grpc-put,grpc-range,grpc-keepalive,grpc-keepalive-shared,grpc-lock \
    --concurrency 1,64 --rounds 2 --grpc-watchers 1000 --json "$OUT/grpc.json" | tee "$OUT/grpc.md"
target/release/leasebench --op acquire --concurrency 1,64 --rounds 2 \
    --json "$OUT/v1-watch-none.json" | tee "$OUT/v1-watch-none.md"
target/release/leasebench --op acquire --concurrency 1,64 --rounds 2 --v1-watchers 1000 \
    --json "$OUT/v1-watch-1000.json" | tee "$OUT/v1-watch-1000.md"
target/release/leasebench --op get --concurrency 1,64 --ops 2000 --rounds 2 \
    --json "$OUT/get.json" | tee "$OUT/get.md"
target/release/leasebench --op acquire,renew,session-acquire --concurrency 1,64,256 --rounds 2 \
    --json "$OUT/v1-threads-default.json" | tee "$OUT/v1-threads-default.md"
target/release/leasebench --op acquire,renew,session-acquire --concurrency 1,64,256 --rounds 2 \
    --proxy-worker-threads 1 --json "$OUT/v1-threads-1.json" | tee "$OUT/v1-threads-1.md"
# etcd 3.4's read buffer: every operation settled (the default) and not, and the long cells.
target/release/leasebench --op acquire,renew,session-acquire,get --concurrency 1,64,256 --rounds 2 \
    --json "$OUT/v1-settled.json" | tee "$OUT/v1-settled.md"
target/release/leasebench --op acquire,renew,session-acquire,get --concurrency 1,64,256 --rounds 2 \
    --no-settle --json "$OUT/v1-unsettled.json" | tee "$OUT/v1-unsettled.md"
target/release/leasebench --op grpc-put,grpc-range,grpc-keepalive,grpc-keepalive-shared,grpc-lock \
    --concurrency 1,64 --rounds 2 --json "$OUT/grpc-settled.json" | tee "$OUT/grpc-settled.md"
target/release/leasebench --op grpc-keepalive,renew --concurrency 64 --rounds 2 --ops 40000 \
    --json "$OUT/settle-on.json" | tee "$OUT/settle-on.md"
target/release/leasebench --op grpc-keepalive,renew --concurrency 64 --rounds 2 --ops 40000 \
    --no-settle --json "$OUT/settle-off.json" | tee "$OUT/settle-off.md"
# What a watch's fan-out costs etcd: 8 more watchers of every key, and none.
target/release/leasebench --op session-acquire,acquire --concurrency 64 --rounds 2 --ops 10000 \
    --json "$OUT/fanout-0.json" | tee "$OUT/fanout-0.md"
target/release/leasebench --op session-acquire,acquire --concurrency 64 --rounds 2 --ops 10000 \
    --etcd-watchers 8 --json "$OUT/fanout-8.json" | tee "$OUT/fanout-8.md"
target/release/fencebench --json "$OUT/fencebench.json" --chart "$OUT/fencebench.svg" | tee "$OUT/fencebench.md"
ensure_postgres
target/release/pgfencebench --rounds 3 --ops 3000 --json "$OUT/pgfencebench.json" | tee "$OUT/pgfencebench.md"
cargo bench --locked -p fencing --bench enforcement | tee "$OUT/criterion.txt"
echo "results in $OUT/"
