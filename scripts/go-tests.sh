#!/usr/bin/env bash
# The Go SDK's tests: sdk/go (the SDK, against a real etcd and real binaries that the tests start
# on free loopback ports, and the robot example), then sdk/go/pgtest (Admit through Debian's
# lib/pq in the PostgreSQL that ensure_postgres provides). Builds lease-proxy, fence-gateway, the
# warehouse inventory and dev-pki unless LEASE_PROXY_BIN names binaries already built (then
# FENCE_GATEWAY_BIN, WAREHOUSE_BIN and DEV_PKI_BIN are read too). Nothing is fetched: GOPROXY is
# off and the SDK uses only the standard library. Arguments go to `go test` for sdk/go
# (e.g. `-run Hostile -v`).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
ensure_deps
ensure_postgres
ensure_go

ensure_binaries
export GOPROXY=off GOFLAGS=-mod=readonly

echo "==> gofmt, go vet"
unformatted=$(/usr/bin/gofmt -l sdk/go)
if [ -n "$unformatted" ]; then
  echo "not gofmt-formatted:" $unformatted >&2
  exit 1
fi
(cd sdk/go && /usr/bin/go vet ./...)
(cd sdk/go/pgtest && /usr/bin/go vet ./...)
echo "==> go test (sdk/go)"
(cd sdk/go && /usr/bin/go test -count=1 ./... "$@")
echo "==> go test (sdk/go/pgtest: Admit in PostgreSQL)"
(cd sdk/go/pgtest && /usr/bin/go test -count=1 ./...)
