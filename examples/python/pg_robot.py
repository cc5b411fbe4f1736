#!/usr/bin/env python3
"""A warehouse robot in Python that writes its counts straight into PostgreSQL with psycopg,
fenced by the database itself (docs/POSTGRES.md): lease an aisle through lease-proxy with the
Python SDK, then write each count in a transaction of its own that presents the grant's signed
fencing token,

    BEGIN;
    SET LOCAL fencing.token = '<lease.fencing_token>';
    INSERT INTO applied (aisle, robot, revision, count) VALUES (…);
    COMMIT;

into the table the warehouse inventory (``warehouse inventory --db postgres://… --fence-in-db``)
protects with ``fencing.protect('applied', 'aisle')``: the database refuses a token below the
aisle's mark (SQLSTATE 23F01), so the Rust robots, writing through the inventory, and this one
are fenced by the same marks. A refused write is never retried with the same token. One
``event …`` line per outcome, as robot.py's:

    event acquired AISLE TOKEN | event write-ok AISLE | event stale-db AISLE
    event refused-db AISLE SQLSTATE | event lost AISLE REASON | event released AISLE
    event write-error SQLSTATE | event error acquire MESSAGE

    python3 pg_robot.py --proxy http://127.0.0.1:7070 --aisles aisle-1,aisle-2 --name py-robot \\
        --database-url postgres://robot:…@127.0.0.1/warehouse
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from typing import List, Optional

import psycopg
from psycopg import errors

from lease_proxy_client import Client, Held, LeaseProxyError


def parse(argv: Optional[List[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--proxy", required=True, help="lease-proxy's base URL")
    p.add_argument("--database-url", required=True, help="the inventory's PostgreSQL database")
    p.add_argument("--aisles", required=True, help="aisles to choose from, comma-separated")
    p.add_argument("--name", required=True, help="robot name (the lease holder)")
    p.add_argument("--ttl", type=int, default=3, help="lease TTL in seconds")
    p.add_argument("--rounds", type=int, default=0, help="leases to take before exiting (0: forever)")
    p.add_argument("--updates", type=int, default=0, help="counts written per lease (0: 3 to 8 at random)")
    p.add_argument("--count-time", type=float, default=0.25, help="mean seconds counting takes")
    p.add_argument(
        "--careless",
        action="store_true",
        help="write without checking lease.lost first (as a paused process does): only the database stops it",
    )
    p.add_argument("--ca", default=os.environ.get("WAREHOUSE_CA"), help="CA bundle for https:// URLs")
    return p.parse_args(argv)


def say(line: str) -> None:
    print(f"event {line}", flush=True)


def write_count(db: psycopg.Connection, aisle: str, robot: str, token: int, fencing_token: str, count: int) -> None:
    """One fenced transaction: the trigger on ``applied`` admits the row's aisle with the token."""
    with db.transaction():  # BEGIN … COMMIT (ROLLBACK on an exception)
        # SET LOCAL fencing.token = '…', with the token as a bind parameter.
        db.execute("SELECT set_config('fencing.token', %s, true)", [fencing_token])
        db.execute(
            "INSERT INTO applied (aisle, robot, revision, count) VALUES (%s, %s, %s, %s)",
            [aisle, robot, token, count],
        )


def work_one(client: Client, db: psycopg.Connection, args: argparse.Namespace, aisle: str) -> None:
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
            if lease.lost.is_set() and not args.careless:
                say(f"lost {aisle} {lease.lost_reason}")
                return
            try:
                write_count(db, aisle, args.name, lease.token, lease.fencing_token, random.randrange(500))
            except errors.IntegrityError as e:
                if e.sqlstate != "23F01":
                    raise
                say(f"stale-db {aisle}")  # a newer holder's mark: the lease is lost, stop
                return
            except psycopg.Error as e:
                if (e.sqlstate or "").startswith("28F"):  # not a token the database accepts
                    say(f"refused-db {aisle} {e.sqlstate}")
                    return
                say(f"write-error {e.sqlstate}")  # 40F01 and the like: may be retried
                continue
            say(f"write-ok {aisle}")
    say(f"released {aisle}")


def main(argv: Optional[List[str]] = None) -> int:
    args = parse(argv)
    aisles = [a for a in args.aisles.split(",") if a]
    verify = args.ca if args.ca else True
    client = Client(args.proxy, token=os.environ.get("WAREHOUSE_TOKEN"), verify=verify)
    # autocommit: no transaction is left open between writes; each write's is explicit.
    with client, psycopg.connect(args.database_url, autocommit=True) as db:
        done = 0
        while args.rounds == 0 or done < args.rounds:
            work_one(client, db, args, random.choice(aisles))
            done += 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
