# shellcheck shell=bash
# Installs the Debian packages the project needs when they are missing. Sourced by run.sh and
# test.sh; works as root or through sudo on a fresh Debian machine.

apt_install() {
  local missing=("$@")
  [ ${#missing[@]} -eq 0 ] && return 0
  local sudo=()
  if [ "$(id -u)" -ne 0 ]; then sudo=(sudo); fi
  echo "==> installing: ${missing[*]}"
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

ensure_deps() {
  local missing=()
  command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
  command -v protoc >/dev/null 2>&1 || missing+=(protobuf-compiler)
  command -v curl >/dev/null 2>&1 || missing+=(curl)
  command -v cc >/dev/null 2>&1 || missing+=(build-essential)
  apt_install "${missing[@]}"
  if ! command -v cargo >/dev/null 2>&1; then
    echo "cargo not found: install a Rust toolchain (rustup) first" >&2
    exit 1
  fi
}

as_postgres() {
  if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else sudo -u postgres "$@"; fi
}

# A PostgreSQL server on 127.0.0.1:5432 with the role and database the tests use
# (FENCING_TEST_POSTGRES, default postgres://lease_proxy:lease_proxy@127.0.0.1:5432/lease_proxy_test).
ensure_postgres() {
  command -v pg_lsclusters >/dev/null 2>&1 || apt_install postgresql
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
SELECT 'CREATE DATABASE lease_proxy_test OWNER lease_proxy'
  WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = 'lease_proxy_test')\gexec
SQL
}
