#!/usr/bin/env python3
"""The share of lease-proxy's CPU samples per kind of task, from folded stacks (inferno's or
Brendan Gregg's `stack;frames count` lines): the HTTP/1.1 connections (split into the lease
handler, axum's router and layers, the kernel's send and receive, and hyper itself), the HTTP/2
connection to etcd, the keepalive shards, the group-commit batcher, other lease-proxy tasks, and
the runtime's own parking, polling and context switches. Used by scripts/profile.sh.

    scripts/profile-tasks.py renew64.folded
"""

import collections
import re
import sys

HTTP1 = ("UpgradeableConnection", "hyper::server", "proto::h1")
ETCD_H2 = ("H2ClientFuture", "h2::client", "h2::proto::connection")
RUNTIME = re.compile(r"epoll_wait|park|futex|schedule|finish_task_switch|Parker|Unparker")


def kind(stack: str) -> str:
    """The task kind one sampled stack belongs to (the first rule that matches)."""
    if any(m in stack for m in ETCD_H2):
        return "HTTP/2 connection to etcd"
    if any(m in stack for m in HTTP1):
        if re.search(r"lease_proxy::(lease|api|auth|etcd)", stack):
            return "HTTP/1.1 connection: the lease handler (lease_proxy::)"
        if "axum::" in stack or "tower_http" in stack:
            return "HTTP/1.1 connection: axum's router and layers"
        if re.search(r"tcp_sendmsg|sock_write|writev", stack):
            return "HTTP/1.1 connection: the kernel's send"
        if re.search(r"tcp_recvmsg|sock_read|recvfrom|readv|sys_read", stack):
            return "HTTP/1.1 connection: the kernel's receive"
        return "HTTP/1.1 connection: hyper (parse, encode, poll)"
    if "etcd::keepalive::" in stack:
        return "keepalive shards (lease_proxy::etcd::keepalive)"
    if "etcd::batch::" in stack:
        return "group-commit batcher (lease_proxy::etcd::batch)"
    if "lease_proxy::" in stack:
        return "other lease-proxy tasks (e.g. a spawned acquire attempt)"
    if "tonic::" in stack or "tower::buffer" in stack:
        return "tonic's buffer worker"
    if RUNTIME.search(stack):
        return "runtime: parking, epoll, wake-ups, context switches"
    return "other"


def main(path: str) -> None:
    shares: collections.Counter[str] = collections.Counter()
    for line in open(path, encoding="utf-8"):
        stack, _, count = line.rstrip("\n").rpartition(" ")
        if stack and count.isdigit():
            shares[kind(stack)] += int(count)
    total = sum(shares.values()) or 1
    for name, n in shares.most_common():
        print(f"{100 * n / total:5.1f} %  {name}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
