#!/usr/bin/env python3
"""A warehouse robot in Python with the Python SDK, doing the job of the Rust, Go and
TypeScript robots: it joins the fleet ``aisles`` (``--fleet``) as member ``--name`` and counts
whatever aisles the service assigns it, each until it is moved to another member (``event lost
AISLE handed-off``, then released) or lost, sending each count with the aisle's fencing token to
fence-gateway (``--gateway``, straight; else through the proxy's forward route, which goes to
fence-gateway) and the inventory behind it. SIGINT or SIGTERM drains the member (its aisles go
to the others) and leaves the fleet. With ``--aisles`` instead it leases aisles of its own
choosing, one after the other, and releases each after ``--updates`` counts.

Unlike the Rust demo's careless robot, which writes without looking at its lost signal so
that fencing has zombie writes to refuse, this one checks ``lease.lost`` before every write —
what a real client should do; fencing still refuses whatever slips through. One ``event …``
line per outcome:

    event joined FLEET | event left FLEET
    event acquired AISLE TOKEN | event write-ok AISLE | event stale-enforcer AISLE
    event stale-proxy AISLE | event lost AISLE REASON | event released AISLE
    event write-error STATUS | event error acquire MESSAGE

    python3 robot.py --proxy http://127.0.0.1:7070 --gateway http://127.0.0.1:7071 --name py-robot
    python3 robot.py --proxy http://127.0.0.1:7070 --aisles aisle-1,aisle-2 --name py-robot
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import threading
import time
from typing import Any, List, Optional

import httpx

from lease_proxy_client import Client, Held, Lease, LeaseProxyError, Lost, fencing_headers


def parse(argv: Optional[List[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--proxy", required=True, help="lease-proxy's base URL")
    p.add_argument("--fleet", default="aisles", help="the fleet to join (unless --aisles)")
    p.add_argument("--aisles", help="lease these aisles, comma-separated, instead of joining a fleet")
    p.add_argument("--gateway", help="fence-gateway's base URL (default: through the proxy's forward route)")
    p.add_argument("--name", required=True, help="robot name (the member, or the lease holder)")
    p.add_argument("--ttl", type=int, default=3, help="session (or lease) TTL in seconds")
    p.add_argument("--rounds", type=int, default=0, help="with --aisles: leases to take before exiting (0: forever)")
    p.add_argument("--updates", type=int, default=0, help="with --aisles: counts sent per lease (0: 3 to 8 at random)")
    p.add_argument("--count-time", type=float, default=0.25, help="mean seconds counting takes")
    p.add_argument("--ca", default=os.environ.get("WAREHOUSE_CA"), help="CA bundle for https:// URLs")
    return p.parse_args(argv)


_SAYING = threading.Lock()  # one line at a time: each aisle's work has a thread of its own


def say(line: str) -> None:
    with _SAYING:
        print(f"event {line}", flush=True)


def count_and_write(args: argparse.Namespace, store: Optional[httpx.Client], lease: Lease) -> bool:
    """Counts the lease's aisle and writes the count: False once the lease is lost (said) or the
    write refused, True to go on."""
    aisle = lease.resource
    # Counting takes a while; it stops the moment the lease is lost.
    if lease.lost.wait(random.uniform(0.4, 1.6) * args.count_time) or lease.lost.is_set():
        if lease.lost_reason != "released":  # released by this robot (leaving): not a loss
            say(f"lost {aisle} {lease.lost_reason}")
        return False
    count = {"robot": args.name, "count": random.randrange(500)}
    try:
        if store is not None:  # straight to fence-gateway, with the token
            response = store.put(f"/aisles/{aisle}/count", json=count, headers=fencing_headers(lease))
        else:  # the proxy adds the token and forwards to fence-gateway
            response = lease.forward("PUT", f"aisles/{aisle}/count", json=count)
    except Lost:
        say(f"lost {aisle} {lease.lost_reason}")
        return False
    except (LeaseProxyError, httpx.TransportError) as e:
        say(f"write-error {e}")
        return True
    if response.status_code == 200:
        say(f"write-ok {aisle}")
        return True
    if response.status_code == 409:
        say(f"stale-enforcer {aisle}")  # fence-gateway saw a newer token
        return False
    if response.status_code in (403, 410):
        say(f"stale-proxy {aisle}")
        return False
    say(f"write-error {response.status_code}")
    return True


def work_one(client: Client, store: Optional[httpx.Client], args: argparse.Namespace, aisle: str) -> None:
    try:
        lease = client.acquire(aisle, ttl=args.ttl, holder=args.name, wait=5.0)
    except Held:
        return
    except LeaseProxyError as e:
        say(f"error acquire {e}")
        time.sleep(0.5)
        return
    say(f"acquired {aisle} {lease.token}")
    with lease:  # released on the way out, whatever happens
        for _ in range(args.updates or random.randint(3, 8)):
            if not count_and_write(args, store, lease):
                return
    say(f"released {aisle}")


def member(client: Client, store: Optional[httpx.Client], args: argparse.Namespace) -> None:
    """Joins the fleet and counts each aisle assigned until it is moved away or lost; on SIGINT
    or SIGTERM drains (its aisles go to the other members) and leaves."""
    fleet = client.join_fleet(args.fleet, member=args.name, ttl=args.ttl)
    say(f"joined {args.fleet}")

    def stop(*_: Any) -> None:
        def bye() -> None:
            try:
                fleet.drain()
            except LeaseProxyError:
                pass
            fleet.leave()

        threading.Thread(target=bye, daemon=True).start()

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)

    def work(lease: Lease) -> None:
        say(f"acquired {lease.resource} {lease.token}")
        while count_and_write(args, store, lease):
            pass

    try:
        fleet.serve(work)  # each aisle's work in a thread; released when it returns
    finally:
        fleet.leave()
        say(f"left {args.fleet}")


def main(argv: Optional[List[str]] = None) -> int:
    args = parse(argv)
    verify = args.ca if args.ca else True
    store = httpx.Client(base_url=args.gateway, verify=verify, timeout=10) if args.gateway else None
    with Client(args.proxy, token=os.environ.get("WAREHOUSE_TOKEN"), verify=verify) as client:
        if not args.aisles:
            member(client, store, args)
            return 0
        aisles = [a for a in args.aisles.split(",") if a]
        done = 0
        while args.rounds == 0 or done < args.rounds:
            work_one(client, store, args, random.choice(aisles))
            done += 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
