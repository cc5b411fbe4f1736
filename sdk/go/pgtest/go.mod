module lease-proxy.dev/leaseproxy/pgtest

go 1.19

require (
	github.com/lib/pq v1.10.7
	lease-proxy.dev/leaseproxy v0.0.0
)

// Nothing is fetched: the SDK is the directory above, lib/pq is Debian's
// golang-github-lib-pq-dev (scripts/deps.sh installs it).
replace (
	github.com/lib/pq => /usr/share/gocode/src/github.com/lib/pq
	lease-proxy.dev/leaseproxy => ../
)
