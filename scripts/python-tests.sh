#!/usr/bin/env bash
# The Python SDK's tests (sdk/python/tests, the Python robot example's included), against a real
# etcd and real binaries that the pytest fixtures start on free loopback ports: builds lease-proxy
# (and, for the robot, fence-gateway and the warehouse inventory; dev-pki for the TLS tests'
# certificates), makes or reuses the virtual environment target/venv, installs the SDK with
# pinned test dependencies (psycopg for the in-database fencing tests, which need the PostgreSQL
# that ensure_postgres provides; selenium for the dashboard's tests, which drive Debian's headless
# Chromium through its chromedriver, both from ensure_browser), runs pytest.
# Arguments are passed to pytest (e.g. `-k session`).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
ensure_deps
ensure_postgres
ensure_python
ensure_browser

echo "==> building lease-proxy, fence-gateway, the warehouse example and dev-pki"
cargo build --locked -q -p lease-proxy --bin lease-proxy
cargo build --locked -q -p fencing --bin fence-gateway
cargo build --locked -q -p lease-proxy-examples --bin warehouse --bin dev-pki
bin="${CARGO_TARGET_DIR:-$PWD/target}/debug"

venv=target/venv
if [ ! -x "$venv/bin/python" ]; then
  echo "==> creating $venv"
  python3 -m venv "$venv"
fi
echo "==> installing the SDK and its test dependencies into $venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check \
  "httpx==0.28.1" "pytest==8.4.2" "pytest-asyncio==1.2.0" "psycopg[binary]==3.3.9" "selenium==4.51.0" -e "sdk/python[test]"

echo "==> pytest"
LEASE_PROXY_BIN="$bin/lease-proxy" FENCE_GATEWAY_BIN="$bin/fence-gateway" WAREHOUSE_BIN="$bin/warehouse" \
  DEV_PKI_BIN="$bin/dev-pki" \
  "$venv/bin/python" -m pytest -ra -p no:cacheprovider sdk/python/tests "$@"
