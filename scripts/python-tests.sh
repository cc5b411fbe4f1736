#!/usr/bin/env bash
# The Python SDK's tests (sdk/python/tests, the Python robot example's included), against a real
# etcd and real binaries that the pytest fixtures start on free loopback ports: builds lease-proxy
# (and, for the robot, fence-gateway and the warehouse inventory; dev-pki for the TLS tests'
# certificates), makes or reuses the virtual environment target/venv, installs the SDK with
# pinned test dependencies (psycopg for the in-database fencing tests, which need the PostgreSQL
# that ensure_postgres provides; selenium for the dashboard's tests, which drive Debian's headless
# Chromium through its chromedriver, both from ensure_browser; python-etcd3 with the grpcio,
# protobuf and tenacity it still works with, for the differential test of third-party etcd
# clients), installs the npm etcd3 client's pinned tree (sdk/python/tests/npm-etcd3's
# package-lock.json, `npm ci` into target/npm-etcd3, again only when the lock file changed; node
# and npm from ensure_node), runs pytest. The binaries are built unless LEASE_PROXY_BIN names ones
# already built (then FENCE_GATEWAY_BIN, WAREHOUSE_BIN and DEV_PKI_BIN are read too).
# Arguments are passed to pytest (e.g. `-k session`).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
ensure_deps
ensure_postgres
ensure_python
ensure_browser
ensure_node

ensure_binaries

venv=target/venv
if [ ! -x "$venv/bin/python" ]; then
  echo "==> creating $venv"
  python3 -m venv "$venv"
fi
echo "==> installing the SDK and its test dependencies into $venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check \
  "httpx==0.28.1" "pytest==8.4.2" "pytest-asyncio==1.2.0" "psycopg[binary]==3.3.9" "selenium==4.51.0" \
  "etcd3==0.12.0" "grpcio==1.74.0" "protobuf==3.20.3" "tenacity==6.3.1" "six==1.17.0" \
  -e "sdk/python[test]"
# python-etcd3 0.12.0 (its last release) needs protobuf 3.x for its generated modules and
# tenacity 6.x for the wait function of its lock(): tenacity 7 removed the call style it uses.

npm_dir="$PWD/target/npm-etcd3"
lock=sdk/python/tests/npm-etcd3/package-lock.json
if ! cmp -s "$lock" "$npm_dir/package-lock.json" || [ ! -f "$npm_dir/node_modules/etcd3/package.json" ]; then
  echo "==> installing the npm etcd3 client (pinned by $lock) into $npm_dir"
  rm -rf "$npm_dir"
  mkdir -p "$npm_dir"
  cp sdk/python/tests/npm-etcd3/package.json "$lock" "$npm_dir/"
  (cd "$npm_dir" && /usr/bin/npm ci --ignore-scripts --no-audit --no-fund --loglevel=error)
fi

echo "==> pytest"
NPM_ETCD3_DIR="$npm_dir" \
  "$venv/bin/python" -m pytest -ra -p no:cacheprovider sdk/python/tests "$@"
