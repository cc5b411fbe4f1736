module lease-proxy.dev/leaseproxy

go 1.19
