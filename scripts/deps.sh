# shellcheck shell=bash
# Installs the Debian packages the project needs when they are missing. Sourced by run.sh,
# test.sh and bench.sh; works as root or through sudo on a fresh Debian machine.
#
# Each check tests what the build or a script actually uses — a file, or the tool doing its job —
# not merely that some binary of that name exists: Debian's protobuf-compiler only *recommends*
# libprotobuf-dev, whose well-known .proto files etcd-client's build imports, so `protoc` on PATH
# says nothing about whether the build can run.
#
#   DEPS_DRY_RUN=1   print what would be installed ("would install: …") and install nothing
#
# Why a system protoc and not a crate that ships one: etcd-client's build script runs protoc
# through prost-build, which finds it only through PATH or the PROTOC variable. A crate that
# vendors protoc (protoc-bin-vendored) puts it in the cargo registry, a path no configuration
# file can name, so every command would need a wrapper exporting PROTOC; protobuf-src builds
# protoc from C++ sources (cmake, g++) and adds minutes to every clean build. Debian's
# protobuf-compiler + libprotobuf-dev are two small packages from the archive this script
# already installs from.

# The packages a check found missing; filled by the check_* functions.
DEPS_MISSING=()

deps_need() {
  local pkg
  for pkg in "$@"; do
    [[ " ${DEPS_MISSING[*]} " == *" $pkg "* ]] || DEPS_MISSING+=("$pkg")
  done
}

# protoc can compile a file importing a well-known type (what etcd-client's protos do).
protoc_has_well_known_types() {
  local dir ok=1
  dir=$(mktemp -d) || return 1
  printf 'syntax = "proto3";\nimport "google/protobuf/descriptor.proto";\n' >"$dir/probe.proto"
  protoc --proto_path="$dir" --descriptor_set_out="$dir/out.pb" "$dir/probe.proto" >/dev/null 2>&1 && ok=0
  rm -rf "$dir"
  return "$ok"
}

# cc can compile and link a C program against libc (what libsqlite3-sys and ring build).
cc_builds_c() {
  local dir ok=1
  dir=$(mktemp -d) || return 1
  printf '#include <stdio.h>\nint main(void) { return puts("") < 0; }\n' >"$dir/probe.c"
  cc -o "$dir/probe" "$dir/probe.c" >/dev/null 2>&1 && ok=0
  rm -rf "$dir"
  return "$ok"
}

# What building and running the binaries, the demo and the tests need.
check_build_deps() {
  type -P etcd >/dev/null || deps_need etcd-server
  # etcdctl, which the gRPC tests run against the proxy and etcd (proxy/tests/grpc.rs): checked
  # as the file the tests run, since another `etcdctl` on PATH may be any version.
  [ -x /usr/bin/etcdctl ] || deps_need etcd-client
  if ! type -P protoc >/dev/null; then
    deps_need protobuf-compiler libprotobuf-dev
  elif ! protoc_has_well_known_types; then
    deps_need libprotobuf-dev
  fi
  { type -P cc >/dev/null && cc_builds_c; } || deps_need build-essential
  type -P curl >/dev/null || deps_need curl
  # The tests and the demo signal processes with /bin/kill (procps), not the shell builtin.
  type -P kill >/dev/null || deps_need procps
}

# What ensure_postgres uses: the server binaries, the cluster tools and psql.
check_postgres_deps() {
  local servers=(/usr/lib/postgresql/*/bin/postgres)
  if [ ! -x "${servers[0]}" ] || ! type -P pg_lsclusters >/dev/null || ! type -P pg_createcluster >/dev/null \
    || ! type -P pg_ctlcluster >/dev/null || ! type -P psql >/dev/null; then
    deps_need postgresql
  fi
  # The in-database package (docs/POSTGRES.md) needs pgcrypto, from the server's contrib modules
  # (Debian: in postgresql-NN, pulled in by postgresql-contrib).
  local pgcrypto=(/usr/share/postgresql/*/extension/pgcrypto.control)
  [ -f "${pgcrypto[0]}" ] || deps_need postgresql-contrib
}

# What scripts/python-tests.sh uses: a python3 that makes virtual environments with pip in them
# (`python3 -m venv`; Debian ships venv's ensurepip separately, in python3-venv).
check_python_deps() {
  if ! type -P python3 >/dev/null; then
    deps_need python3 python3-venv
  elif ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
    deps_need python3-venv
  fi
}

# What the dashboard's tests in a real browser use (sdk/python/tests/test_dashboard.py): Debian's
# headless-capable Chromium and the WebDriver server of the same build, checked as the files
# the tests start.
check_browser_deps() {
  [ -x /usr/bin/chromium ] || deps_need chromium
  [ -x /usr/bin/chromedriver ] || deps_need chromium-driver
}

# What the npm etcd3 client's differential tests use (sdk/python/tests/test_etcd_clients.py):
# Debian's node, which runs the client's cases, and npm, which installs its pinned tree
# (`npm ci` in scripts/python-tests.sh); checked as the files the test and the script run, since
# another `node` or `npm` on PATH may be any version. Debian packages npm apart from nodejs.
# The TypeScript SDK's tests (scripts/typescript-tests.sh) use the same two and need Node 18.8 or
# later (bookworm's is 18.20), whose features that script checks.
check_node_deps() {
  [ -x /usr/bin/node ] || deps_need nodejs
  [ -x /usr/bin/npm ] || deps_need npm
}

# What scripts/go-tests.sh uses: Debian's Go toolchain (golang-go; Go 1.19 on bookworm), checked
# as the files the script runs (go, and gofmt, which the same package ships) and by running go,
# and the source of Debian's lib/pq, which the Go SDK's PostgreSQL test module (sdk/go/pgtest)
# builds against with a `replace` directive — no Go module proxy is needed, or reached: the SDK
# itself uses only the standard library.
check_go_deps() {
  { [ -x /usr/bin/go ] && [ -x /usr/bin/gofmt ] && /usr/bin/go version >/dev/null 2>&1; } || deps_need golang-go
  [ -f /usr/share/gocode/src/github.com/lib/pq/go.mod ] || deps_need golang-github-lib-pq-dev
}

apt_install() {
  local missing=("$@")
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "${DEPS_DRY_RUN:-0}" = 1 ]; then
    echo "would install: ${missing[*]}"
    return 0
  fi
  local sudo=()
  if [ "$(id -u)" -ne 0 ]; then
    type -P sudo >/dev/null || { echo "missing ${missing[*]}, and not root without sudo: install them first" >&2; exit 1; }
    sudo=(sudo)
  fi
  type -P apt-get >/dev/null || { echo "missing ${missing[*]} and no apt-get: install them by hand" >&2; exit 1; }
  echo "==> installing: ${missing[*]}"
  one_at_a_time "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  one_at_a_time "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# Runs a command holding a lock that every script sourcing this file shares. scripts/test.sh
# runs the Python suite beside the TypeScript and Go ones, and each ensures the same packages and
# the same PostgreSQL role: two apt-gets at once fight over dpkg's lock, and two `ALTER ROLE`s of
# one role at once fail with "tuple concurrently updated". The lock file is opened for reading
# (flock needs no more), so a file root made first does not lock out a user after it. The command
# runs without the lock's descriptor: a daemon it starts (the postmaster) would otherwise inherit
# it and hold the lock for as long as it runs. The wait is bounded, so a holder that never lets go
# is an error naming the lock rather than a hang.
one_at_a_time() {
  type -P flock >/dev/null || { echo "flock (util-linux) not found" >&2; exit 1; }
  local lock="${TMPDIR:-/tmp}/lease-proxy-deps.lock"
  [ -e "$lock" ] || : >"$lock"
  (
    local wait="${DEPS_LOCK_WAIT:-900}"
    flock -w "$wait" 9 || { echo "waited ${wait}s for $lock: whatever holds it (fuser $lock) never let go" >&2; exit 1; }
    "$@" 9<&-
  ) 9<"$lock"
}

# Runs a check, installs what it found missing, then runs it again: anything still missing after
# the install is reported by name instead of surfacing later as a build or test failure.
ensure_with() {
  local check=$1
  DEPS_MISSING=()
  "$check"
  apt_install "${DEPS_MISSING[@]}"
  [ "${DEPS_DRY_RUN:-0}" = 1 ] && return 0
  [ ${#DEPS_MISSING[@]} -eq 0 ] && return 0
  DEPS_MISSING=()
  "$check"
  if [ ${#DEPS_MISSING[@]} -ne 0 ]; then
    echo "still missing after installing: ${DEPS_MISSING[*]}" >&2
    exit 1
  fi
}

ensure_deps() {
  ensure_with check_build_deps
  if ! type -P cargo >/dev/null; then
    echo "cargo not found: install a Rust toolchain (rustup) first" >&2
    exit 1
  fi
}

# Chromium and chromedriver, for the dashboard's tests.
ensure_browser() {
  ensure_with check_browser_deps
}

# python3 with venv and ensurepip, for the Python SDK's tests (and any script making target/venv).
ensure_python() {
  ensure_with check_python_deps
  [ "${DEPS_DRY_RUN:-0}" = 1 ] && return 0
  python3 -c 'import sys; sys.exit(sys.version_info < (3, 9))' || {
    echo "python3 is $(python3 -V 2>&1); the Python SDK needs 3.9 or later" >&2
    exit 1
  }
}

# node (16 or later: the npm etcd3 client's floor) and npm, for the npm client's tests.
ensure_node() {
  ensure_with check_node_deps
  [ "${DEPS_DRY_RUN:-0}" = 1 ] && return 0
  /usr/bin/node -e 'process.exit(Number(process.versions.node.split(".")[0]) < 16 ? 1 : 0)' || {
    echo "/usr/bin/node is $(/usr/bin/node --version 2>&1); the npm etcd3 client needs 16 or later" >&2
    exit 1
  }
}

# Go 1.19 or later (and lib/pq's source), for the Go SDK's tests.
ensure_go() {
  ensure_with check_go_deps
  [ "${DEPS_DRY_RUN:-0}" = 1 ] && return 0
  /usr/bin/go version | awk '{ split(substr($3, 3), v, "."); exit !(v[1] > 1 || (v[1] == 1 && v[2] >= 19)) }' || {
    echo "$(/usr/bin/go version 2>&1): the Go SDK needs Go 1.19 or later" >&2
    exit 1
  }
}

as_postgres() {
  if [ "$(id -u)" -eq 0 ]; then
    type -P runuser >/dev/null || { echo "runuser (util-linux) not found: cannot act as the postgres user" >&2; exit 1; }
    runuser -u postgres -- "$@"
  else
    sudo -u postgres "$@"
  fi
}

# The debug binaries the SDK, API and scenario scripts start — lease-proxy, fence-gateway, the
# warehouse example and dev-pki — built in one cargo invocation (one feature resolution: the
# crates they share are built once), unless LEASE_PROXY_BIN names them already built: then
# FENCE_GATEWAY_BIN, WAREHOUSE_BIN and DEV_PKI_BIN are taken as given too (scripts/test.sh passes
# the ones its test build made). Exports the four *_BIN variables.
ensure_binaries() {
  local bin="${CARGO_TARGET_DIR:-$PWD/target}/debug"
  if [ -z "${LEASE_PROXY_BIN:-}" ]; then
    echo "==> building lease-proxy, fence-gateway, the warehouse example and dev-pki"
    cargo build --locked -q -p lease-proxy -p fencing -p lease-proxy-examples --features fencing/server --bin lease-proxy --bin fence-gateway --bin warehouse --bin dev-pki
  fi
  export LEASE_PROXY_BIN="${LEASE_PROXY_BIN:-$bin/lease-proxy}" \
    FENCE_GATEWAY_BIN="${FENCE_GATEWAY_BIN:-$bin/fence-gateway}" \
    WAREHOUSE_BIN="${WAREHOUSE_BIN:-$bin/warehouse}" DEV_PKI_BIN="${DEV_PKI_BIN:-$bin/dev-pki}"
}

# A PostgreSQL server on 127.0.0.1:5432 with the role and database the tests use
# (FENCING_TEST_POSTGRES, default postgres://lease_proxy:lease_proxy@127.0.0.1:5432/lease_proxy_test).
ensure_postgres() {
  ensure_with check_postgres_deps
  [ "${DEPS_DRY_RUN:-0}" = 1 ] && return 0
  one_at_a_time postgres_ready
}

postgres_ready() {
  local sudo=()
  if [ "$(id -u)" -ne 0 ]; then sudo=(sudo); fi
  local cluster
  cluster=$(pg_lsclusters -h 2>/dev/null | awk 'NR==1 {print $1" "$2}')
  if [ -z "$cluster" ]; then
    local version
    version=$(ls /usr/lib/postgresql | sort -V | tail -n 1)
    "${sudo[@]}" pg_createcluster "$version" main >/dev/null
    cluster="$version main"
  fi
  # shellcheck disable=SC2086
  if ! pg_lsclusters -h | awk -v c="$cluster" '$1" "$2==c {print $4}' | grep -q online; then
    echo "==> starting PostgreSQL $cluster"
    # A postmaster killed a moment ago may still hold its socket lock: try again shortly.
    local tries=0
    until "${sudo[@]}" pg_ctlcluster $cluster start; do
      tries=$((tries + 1))
      [ "$tries" -ge 5 ] && { echo "PostgreSQL would not start" >&2; exit 1; }
      sleep 2
    done
  fi
  for _ in $(seq 50); do
    (cd / && as_postgres psql -qAtc "select 1") >/dev/null 2>&1 && break
    sleep 0.2
  done
  (cd / && as_postgres psql -v ON_ERROR_STOP=1 -qAt) >/dev/null <<'SQL'
DO $$ BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'lease_proxy') THEN
    CREATE ROLE lease_proxy LOGIN PASSWORD 'lease_proxy' CREATEDB;
  END IF;
END $$;
-- The in-database package's tests create (and drop) their own owner, writer and intruder roles.
DO $$ BEGIN
  IF NOT (SELECT rolcreaterole FROM pg_roles WHERE rolname = 'lease_proxy') THEN
    ALTER ROLE lease_proxy CREATEROLE;
  END IF;
END $$;
SELECT 'CREATE DATABASE lease_proxy_test OWNER lease_proxy'
  WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = 'lease_proxy_test')\gexec
SQL
}
