#!/usr/bin/env bash
# The test suite, from a fresh Debian machine: installs what is missing (scripts/deps.sh), then
# formatting, lints and every test. Integration tests spawn their own etcd on free loopback ports.
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
trap 'phase ""; printf "%s\n" "==> phase times" "${phase_times[@]}"' EXIT
phase "installing what is missing (scripts/deps.sh)"
source scripts/deps.sh
ensure_deps
ensure_postgres
ensure_python
ensure_node

phase "cargo fmt --check"
cargo fmt --all --check
phase "the fencing library alone, and with each store or metrics but no server"
cargo clippy -p fencing --lib --no-default-features --locked -- -D warnings
for feature in sqlite postgres metrics; do
  cargo clippy -p fencing --lib --no-default-features --features "$feature" --locked -- -D warnings
done
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
  # Several test processes at once (.config/nextest.toml): the suite mostly waits on etcd.
  phase "cargo nextest run (the workspace compiled through clippy)"
  cargo nextest run --workspace --locked
  phase "the benchmarks linted, doc tests"
  cargo test --workspace --locked --benches --no-run
  cargo test --workspace --locked --doc
  # The SDK and API tests below start the binaries this build made.
  bin="${CARGO_TARGET_DIR:-$PWD/target}/debug"
  export LEASE_PROXY_BIN="$bin/lease-proxy" FENCE_GATEWAY_BIN="$bin/fence-gateway" \
    WAREHOUSE_BIN="$bin/warehouse" DEV_PKI_BIN="$bin/dev-pki"
else
  phase "cargo clippy"
  cargo clippy --workspace --all-targets --locked -- -D warnings
  phase "cargo test"
  cargo test --workspace --locked
fi
phase "Python SDK (pytest)"
scripts/python-tests.sh
phase "TypeScript SDK (node --test)"
scripts/typescript-tests.sh
phase "schemathesis"
scripts/schemathesis.sh
phase "Go SDK (go test)"
scripts/go-tests.sh
