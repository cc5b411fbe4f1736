#!/usr/bin/env python3
"""A warehouse robot in Python with the Python SDK, doing the job the Rust robots
(examples/src/bin/warehouse/robot.rs) did before they joined the fleet ``aisles``: lease an aisle
of its choosing, count it, send each count with the fencing token through the proxy's forward
route (to fence-gateway and the inventory behind it), let the guard renew, stop the moment the
lease is lost, release, repeat.

Unlike the Rust demo's careless robot, which writes without looking at its lost signal so
that fencing has zombie writes to refuse, this one checks ``lease.lost`` before every write —
what a real client should do; fencing still refuses whatever slips through. One ``event …``
line per outcome:

    event acquired AISLE TOKEN | event write-ok AISLE | event stale-enforcer AISLE
    event stale-proxy AISLE | event lost AISLE REASON | event released AISLE
    event write-error STATUS | event error acquire MESSAGE

    python3 robot.py --proxy http://127.0.0.1:7070 --aisles aisle-1,aisle-2 --name py-robot
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from typing import List, Optional

from lease_proxy_client import Client, Held, LeaseProxyError, Lost


def parse(argv: Optional[List[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--proxy", required=True, help="lease-proxy's base URL")
    p.add_argument("--aisles", required=True, help="aisles to choose from, comma-separated")
    p.add_argument("--name", required=True, help="robot name (the lease holder)")
    p.add_argument("--ttl", type=int, default=3, help="lease TTL in seconds")
    p.add_argument("--rounds", type=int, default=0, help="leases to take before exiting (0: forever)")
    p.add_argument("--updates", type=int, default=0, help="counts sent per lease (0: 3 to 8 at random)")
    p.add_argument("--count-time", type=float, default=0.25, help="mean seconds counting takes")
    p.add_argument("--ca", default=os.environ.get("WAREHOUSE_CA"), help="CA bundle for https:// URLs")
    return p.parse_args(argv)


def say(line: str) -> None:
    print(f"event {line}", flush=True)


def work_one(client: Client, args: argparse.Namespace, aisle: str) -> None:
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
            time.sleep(random.uniform(0.4, 1.6) * args.count_time)  # counting takes a while
            if lease.lost.is_set():
                say(f"lost {aisle} {lease.lost_reason}")
                return
            count = {"robot": args.name, "count": random.randrange(500)}
            try:
                response = lease.forward("PUT", f"aisles/{aisle}/count", json=count)
            except Lost:
                say(f"lost {aisle} {lease.lost_reason}")
                return
            except LeaseProxyError as e:
                say(f"write-error {e}")
                continue
            if response.status_code == 200:
                say(f"write-ok {aisle}")
            elif response.status_code == 409:
                say(f"stale-enforcer {aisle}")  # fence-gateway saw a newer token
                return
            elif response.status_code in (403, 410):
                say(f"stale-proxy {aisle}")
                return
            else:
                say(f"write-error {response.status_code}")
    say(f"released {aisle}")


def main(argv: Optional[List[str]] = None) -> int:
    args = parse(argv)
    aisles = [a for a in args.aisles.split(",") if a]
    verify = args.ca if args.ca else True
    with Client(args.proxy, token=os.environ.get("WAREHOUSE_TOKEN"), verify=verify) as client:
        done = 0
        while args.rounds == 0 or done < args.rounds:
            work_one(client, args, random.choice(aisles))
            done += 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
