#!/usr/bin/env bash
# The test suite, from a fresh Debian machine: installs what is missing (scripts/deps.sh), then
# formatting, lints and every test. Integration tests share one etcd started here for the run, each
# under a key prefix of its own; those that stop or compact etcd, or read its metrics or every
# key, start their own.
set -euo pipefail
cd "$(dirname "$0")/.."
# A clean build gains nothing from incremental compilation's cache, which doubles the target dir.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
# Each phase's wall time, printed at the end (CI's time budget is spent here).
phase_times=()
phase() {
  local now
  now=$(date +%s)
  if [[ -n "${phase_name:-}" ]]; then
    phase_times+=("$((now - phase_start))s  $phase_name")
  fi
  phase_name="$1"
  phase_start=$now
  [[ -n "$1" ]] && echo "==> $1"
  return 0
}
# What failed is printed again at the very end, after the phase times: a reader of the log's
# last lines (CI's summary) sees why, not the output of the jobs that ran beside it.
failed_logs=()
on_exit() {
  stop_run_etcd
  phase ""
  printf "%s\n" "==> phase times" "${phase_times[@]}"
  local log
  for log in "${failed_logs[@]}"; do
    echo "==> failed: the last lines of $log"
    tail -n 60 "$log"
  done
}
trap on_exit EXIT
# Jobs run beside a phase in the foreground: each job's output goes to its log under
# target/test-logs and is printed once `await_beside` has waited for it; its time joins the
# phase times. The machine has two cores and most tests wait on etcd, PostgreSQL and timers, so
# a compile or a suite beside them costs less wall time than one after them.
logs="${CARGO_TARGET_DIR:-$PWD/target}/test-logs"
beside_pids=()
beside_names=()
beside() {
  local name=$1
  shift
  mkdir -p "$logs"
  (
    started=$(date +%s)
    status=0
    "$@" || status=$?
    echo "==> $name: exit $status after $(($(date +%s) - started))s"
    exit "$status"
  ) >"$logs/$name.log" 2>&1 &
  beside_pids+=($!)
  beside_names+=("$name")
}
await_beside() {
  local i failed=0
  for i in "${!beside_pids[@]}"; do
    wait "${beside_pids[$i]}" || { failed=1; failed_logs+=("$logs/${beside_names[$i]}.log"); }
    echo "==> beside: ${beside_names[$i]} (its output)"
    cat "$logs/${beside_names[$i]}.log"
    phase_times+=("$(tail -n 1 "$logs/${beside_names[$i]}.log" | sed -n 's/^==> \(.*\): exit \(.*\) after \(.*\)$/\3  (beside) \1, exit \2/p')")
  done
  beside_pids=()
  beside_names=()
  return "$failed"
}
# One etcd for the whole run, named to the tests in LEASE_PROXY_TEST_ETCD (testkit's
# `Etcd::shared` hands it out): the test runner makes a process of each test, so an etcd per
# process would mean one start per test. Its ports are claimed as testkit claims its own (a lock
# on $TMPDIR/lease-proxy-test-ports/PORT), below the kernel's ephemeral range.
run_etcd_pid=""
run_etcd_dir=""
claim_port() {
  local ports="${TMPDIR:-/tmp}/lease-proxy-test-ports" port fd low
  mkdir -p "$ports"
  low=$(awk '{print $1}' /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
  [ "$low" -gt 11000 ] || low=32768
  for _ in $(seq 200); do
    port=$((10000 + RANDOM % (low - 10000)))
    exec {fd}>"$ports/$port"
    if flock -n "$fd" && ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      claimed_port=$port
      return 0
    fi
    exec {fd}>&-
  done
  echo "no free loopback port for the run's etcd" >&2
  return 1
}
start_run_etcd() {
  local client peer url
  claim_port || return 1
  client=$claimed_port
  claim_port || return 1
  peer=$claimed_port
  url="http://127.0.0.1:$client"
  run_etcd_dir=$(mktemp -d "${TMPDIR:-/tmp}/lease-proxy-run-etcd.XXXXXX")
  "${ETCD_BIN:-etcd}" --name run --data-dir "$run_etcd_dir/data" \
    --listen-client-urls "$url" --advertise-client-urls "$url" \
    --listen-peer-urls "http://127.0.0.1:$peer" --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
    --initial-cluster "run=http://127.0.0.1:$peer" --logger zap --log-level warn \
    >"$run_etcd_dir/log" 2>&1 &
  run_etcd_pid=$!
  for _ in $(seq 100); do
    if curl -fsS "$url/health" 2>/dev/null | grep -q '"health":"true"'; then
      export LEASE_PROXY_TEST_ETCD="$url"
      echo "==> the run's etcd: $url"
      return 0
    fi
    sleep 0.1
  done
  echo "the run's etcd did not answer within 10 s:" >&2
  cat "$run_etcd_dir/log" >&2
  return 1
}
stop_run_etcd() {
  if [[ -n "$run_etcd_pid" ]]; then
    kill "$run_etcd_pid" 2>/dev/null || true
    wait "$run_etcd_pid" 2>/dev/null || true
    run_etcd_pid=""
    unset LEASE_PROXY_TEST_ETCD
  fi
  if [[ -n "$run_etcd_dir" ]]; then
    rm -rf "$run_etcd_dir"
    run_etcd_dir=""
  fi
}
phase "installing what is missing (scripts/deps.sh)"
source scripts/deps.sh
ensure_deps
ensure_postgres
ensure_python
ensure_node
# Installed here, not by the suites that need them, which may run at once (apt takes one lock).
ensure_browser
ensure_go

phase "cargo fmt --check"
cargo fmt --all --check
# The fencing library alone, and with each store or metrics but no server: lints only, in a
# target directory of their own (nothing of a check is shared with the test build, and a cargo
# beside the test run would otherwise wait for its lock).
fencing_alone() {
  local dir="${CARGO_TARGET_DIR:-$PWD/target}/fencing-alone"
  CARGO_TARGET_DIR="$dir" cargo clippy -p fencing --lib --no-default-features --locked -- -D warnings
  for feature in sqlite postgres metrics; do
    CARGO_TARGET_DIR="$dir" cargo clippy -p fencing --lib --no-default-features --features "$feature" \
      --locked -- -D warnings
  done
  # The runtime crate as the library uses it: problem+json, backoff, file reads, no serving.
  CARGO_TARGET_DIR="$dir" cargo clippy -p lease-proxy-runtime --lib --no-default-features --locked -- -D warnings
}
if cargo nextest --version >/dev/null 2>&1; then
  # Clippy's lints (-D warnings) in the test build itself: cargo compiles the workspace's own
  # crates with clippy-driver in place of rustc (as `cargo clippy` does for its check), so one
  # build both lints every target and makes the test binaries, instead of a check of everything
  # and then a build of everything. Dependencies are compiled by rustc as ever.
  clippy_driver=$(command -v clippy-driver) || {
    echo "clippy-driver not found: rustup component add clippy" >&2
    exit 1
  }
  export RUSTC_WORKSPACE_WRAPPER="$clippy_driver"
  export CLIPPY_ARGS="-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__"
  phase "cargo nextest build (the workspace compiled through clippy), the benchmarks linted"
  cargo nextest run --workspace --locked --no-run
  cargo test --workspace --locked --benches --no-run
  # The proxy with its negative controls, for the campaign's control test: built here, as that
  # test's harness asks for it (testkit::feature_binary), rather than by the test itself while
  # the suite runs around it.
  cargo build --locked -q -p lease-proxy --bin lease-proxy-controls --features negative-controls
  # Named, so that the test does not ask cargo again (and wait for the doc tests' lock).
  export LEASE_PROXY_CONTROLS_BIN="${CARGO_TARGET_DIR:-$PWD/target}/debug/lease-proxy-controls"
  # Several test processes at once (.config/nextest.toml): the suite mostly waits on etcd.
  phase "cargo nextest run, with the fencing library's lints and the doc tests beside it"
  start_run_etcd
  beside "fencing library lints, doc tests" bash -c "$(declare -f fencing_alone); fencing_alone && cargo test --workspace --locked --doc"
  nextest_status=0
  cargo nextest run --workspace --locked 2>&1 | tee "$logs/nextest.log" || nextest_status=$?
  [ "$nextest_status" -eq 0 ] || failed_logs+=("$logs/nextest.log")
  await_beside
  stop_run_etcd
  [ "$nextest_status" -eq 0 ] || exit "$nextest_status"
  # The SDK and API tests below start the binaries this build made.
  bin="${CARGO_TARGET_DIR:-$PWD/target}/debug"
  export LEASE_PROXY_BIN="$bin/lease-proxy" FENCE_GATEWAY_BIN="$bin/fence-gateway" \
    WAREHOUSE_BIN="$bin/warehouse" DEV_PKI_BIN="$bin/dev-pki"
else
  phase "the fencing library alone, and with each store or metrics but no server"
  fencing_alone
  phase "cargo clippy"
  cargo clippy --workspace --all-targets --locked -- -D warnings
  phase "cargo test"
  start_run_etcd
  cargo test --workspace --locked
fi
phase "Python SDK (pytest), with TypeScript, schemathesis and Go beside it"
# The phase takes about five minutes; one that is stuck ends at this bound (exit 124) and its log
# is printed, rather than running on until CI's own limit ends everything without saying where.
sdk_bound=(timeout --kill-after=30 "${SDK_PHASE_BOUND:-1800}")
beside "TypeScript SDK, schemathesis, Go SDK" "${sdk_bound[@]}" bash -c \
  "scripts/typescript-tests.sh && scripts/schemathesis.sh && scripts/go-tests.sh"
python_status=0
"${sdk_bound[@]}" scripts/python-tests.sh 2>&1 | tee "$logs/python.log" || python_status=$?
[ "$python_status" -eq 0 ] || failed_logs+=("$logs/python.log")
await_beside
[ "$python_status" -eq 0 ] || exit "$python_status"
