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
