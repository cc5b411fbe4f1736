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
phase "cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
phase "the fencing library alone, and with each store or metrics but no server"
cargo clippy -p fencing --lib --no-default-features --locked -- -D warnings
for feature in sqlite postgres metrics; do
  cargo clippy -p fencing --lib --no-default-features --features "$feature" --locked -- -D warnings
done
if cargo nextest --version >/dev/null 2>&1; then
  # Several test processes at once (.config/nextest.toml): the suite mostly waits on etcd.
  phase "cargo nextest run"
  cargo nextest run --workspace --locked
  phase "doc tests"
  cargo test --workspace --locked --doc
else
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
