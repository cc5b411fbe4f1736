#!/usr/bin/env bash
# The test suite, from a fresh Debian machine: installs what is missing (scripts/deps.sh), then
# formatting, lints and every test. Integration tests spawn their own etcd on free loopback ports.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
ensure_deps
ensure_postgres
ensure_python
ensure_node

echo "==> cargo fmt --check"
cargo fmt --all --check
echo "==> cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "==> the fencing library alone (no sqlite, postgres or server features)"
cargo clippy -p fencing --lib --no-default-features --locked -- -D warnings
echo "==> cargo test"
cargo test --workspace --locked
echo "==> Python SDK (pytest)"
scripts/python-tests.sh
echo "==> TypeScript SDK (node --test)"
scripts/typescript-tests.sh
echo "==> schemathesis"
scripts/schemathesis.sh
echo "==> Go SDK (go test)"
scripts/go-tests.sh
