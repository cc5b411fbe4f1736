"""examples/python/pg_robot.py against the warehouse on PostgreSQL with in-database fencing: a
scratch database with the package installed (``fence-gateway pg install``) and the proxy's key
file synced (``pg sync-keys``), the warehouse inventory on it with ``--fence-in-db`` (it
protects the ``applied`` table, resource ``aisle``), and a lease-proxy that pre-fences every
grant into the database (``--prefence-database-url``). The robot leases through the proxy and
writes straight into the table with psycopg; the new holder of an aisle writes through the
inventory. What landed is read from the table's rows."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterator, List
from urllib.parse import urlsplit

import httpx
import pytest

from conftest import ROOT, Etcd, free_port, stop, wait_until
from test_robot_example import Robot, binary, spawn

psycopg = pytest.importorskip("psycopg")

PG_ROBOT = ROOT / "examples" / "python" / "pg_robot.py"
ADMIN_URL = os.environ.get(
    "FENCING_TEST_POSTGRES", "postgres://lease_proxy:lease_proxy@127.0.0.1:5432/lease_proxy_test"
)


@pytest.fixture(scope="module")
def pg_warehouse(workdir: Path, etcd: Etcd, key_file: Path) -> Iterator[dict]:
    """The scratch database (roles: the package's owner; ``robot`` and ``proxy``, writers; the
    installing role runs the inventory and owns its table), the inventory, the proxy."""
    parts = urlsplit(ADMIN_URL)
    password = parts.password or ""
    name = f"warehouse_py_{uuid.uuid4().hex[:12]}"
    roles = {r: f"{name}_{r}" for r in ("owner", "robot", "proxy")}

    def url(user: str) -> str:
        return f"postgres://{user}:{password}@{parts.hostname}:{parts.port or 5432}/{name}"

    installer = url(parts.username or "lease_proxy")
    inventory, proxy = (f"http://127.0.0.1:{free_port()}" for _ in range(2))
    processes: List[subprocess.Popen] = []
    try:
        with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
            admin.execute(f"CREATE DATABASE {name}")
            admin.execute(f"CREATE ROLE {roles['owner']} NOLOGIN")
            admin.execute(f"GRANT {roles['owner']} TO CURRENT_USER")
            for role in ("robot", "proxy"):
                admin.execute(f"CREATE ROLE {roles[role]} LOGIN PASSWORD '{password}'")
            admin.execute(f"GRANT {roles['robot']} TO CURRENT_USER")  # to see its sessions' state
        gateway = binary("FENCE_GATEWAY_BIN", "fence-gateway")
        for command in (
            ["install", "--database-url", installer, "--owner", roles["owner"],
             "--writer", roles["robot"], "--writer", roles["proxy"]],
            ["sync-keys", "--database-url", installer, "--key-file", str(key_file)],
        ):
            done = subprocess.run([gateway, "pg", *command], capture_output=True, text=True, timeout=60)
            assert done.returncode == 0, done.stdout + done.stderr
        processes.append(
            spawn(
                [binary("WAREHOUSE_BIN", "warehouse"), "inventory", "--listen", inventory[7:],
                 "--db", installer, "--fence-in-db", "--db-timeout", "5s"],
                workdir / "pg-inventory.log",
            )
        )
        wait_until(
            lambda: httpx.get(f"{inventory}/log", timeout=1).status_code == 200,
            30,
            "inventory",
            workdir / "pg-inventory.log",
        )
        with psycopg.connect(installer, autocommit=True) as c:  # the robot writes counts, no more
            c.execute(f"GRANT SELECT, INSERT ON applied TO {roles['robot']}")
            c.execute(f"GRANT USAGE ON SEQUENCE applied_seq_seq TO {roles['robot']}")
        processes.append(
            spawn(
                [binary("LEASE_PROXY_BIN", "lease-proxy"), "--listen", proxy[7:],
                 "--etcd-endpoints", etcd.url, "--etcd-prefix", "/lease-proxy-py-pg-robot/",
                 "--key-file", str(key_file), "--data-dir", str(workdir / "pg-robot-proxy"),
                 "--prefence-database-url", url(roles["proxy"])],
                workdir / "pg-robot-proxy.log",
            )
        )
        wait_until(
            lambda: httpx.get(f"{proxy}/readyz", timeout=1).status_code == 200,
            30,
            "lease-proxy",
            workdir / "pg-robot-proxy.log",
        )
        yield {
            "proxy": proxy,
            "inventory": inventory,
            "robot_url": url(roles["robot"]),
            "robot_role": roles["robot"],
            "db": installer,
        }
    finally:
        for p in reversed(processes):
            stop(p)
        with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
            # Membership lets DROP DATABASE … (FORCE) end the roles' sessions.
            for role in ("robot", "proxy"):
                if admin.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [roles[role]]).fetchone():
                    admin.execute(f"GRANT {roles[role]} TO CURRENT_USER")
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            admin.execute("DROP ROLE IF EXISTS " + ", ".join(roles.values()))


def rows(warehouse: dict, aisles: List[str]) -> List[tuple]:
    """(seq, aisle, robot, revision) of the aisles' rows, in the order they were written."""
    with psycopg.connect(warehouse["db"], autocommit=True) as c:
        return c.execute(
            "SELECT seq, aisle, robot, revision FROM applied WHERE aisle = ANY(%s) ORDER BY seq", [aisles]
        ).fetchall()


def mark(warehouse: dict, aisle: str) -> str:
    with psycopg.connect(warehouse["db"], autocommit=True) as c:
        return c.execute("SELECT fencing.mark(%s)", [aisle]).fetchone()[0]


def pause_between_writes(warehouse: dict, robot: Robot) -> None:
    """SIGSTOPs the robot right after a committed write, with no transaction of its open (one
    left open would hold the new holder's pre-fence back: the proxy would withdraw its grants)."""
    while True:
        robot.expect("event write-ok")
        robot.process.send_signal(signal.SIGSTOP)
        with psycopg.connect(warehouse["db"], autocommit=True) as c:
            busy = c.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE usename = %s AND state <> 'idle'",
                [warehouse["robot_role"]],
            ).fetchone()[0]
        if busy == 0:
            return
        robot.process.send_signal(signal.SIGCONT)


def waiting_on_a_lock(warehouse: dict) -> int:
    """The inventory's sessions (the installing role's, not this one) waiting on a lock."""
    with psycopg.connect(warehouse["db"], autocommit=True) as c:
        return c.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
        ).fetchone()[0]


def take_over(proxy: str, aisle: str, holder: str, within: float = 20.0) -> dict:
    """Acquires ``aisle`` once the old grant has expired (409 until then; 503 if its pre-fence
    could not commit in time, which the proxy withdraws); returns the grant."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        response = httpx.post(f"{proxy}/v1/leases/{aisle}", json={"holder": holder, "ttl_seconds": 10}, timeout=10)
        if response.status_code == 201:
            return response.json()
        assert response.status_code in (409, 503), response.text
        time.sleep(0.05)
    raise AssertionError(f"{aisle} not taken over within {within}s")


def put_count(warehouse: dict, aisle: str, fencing_token: str, holder: str) -> httpx.Response:
    """A write through the inventory, as fence-gateway forwards a Rust robot's."""
    return httpx.put(
        f"{warehouse['inventory']}/aisles/{aisle}/count",
        json={"robot": holder, "count": 7},
        headers={"fencing-resource": aisle, "fencing-token": fencing_token},
        timeout=10,
    )


def start(warehouse: dict, *args: str) -> Robot:
    return Robot(
        "--proxy", warehouse["proxy"], "--database-url", warehouse["robot_url"], *args, script=PG_ROBOT
    )


def test_the_pg_robot_writes_its_counts_into_the_database_with_its_token(pg_warehouse: dict) -> None:
    name = f"py-{uuid.uuid4().hex[:10]}"
    aisles = [f"{name}-a", f"{name}-b"]
    robot = start(
        pg_warehouse, "--aisles", ",".join(aisles), "--name", name, "--ttl", "2",
        "--rounds", "3", "--updates", "2", "--count-time", "0.1",
    )
    seen = robot.finish()
    acquired = [line.split() for line in seen if line.startswith("event acquired")]
    assert len(acquired) == 3 and sum(line.startswith("event released") for line in seen) == 3, seen
    assert sum(line.startswith("event write-ok") for line in seen) == 6, seen
    # every write landed on its aisle with the token of the lease it was made under, in order
    assert [(r[1], r[2], r[3]) for r in rows(pg_warehouse, aisles)] == [
        (a[2], name, int(a[3])) for a in acquired for _ in range(2)
    ]
    # and the proxy's pre-fence raised each aisle's mark to its last grant
    for aisle in aisles:
        last = [int(a[3]) for a in acquired if a[2] == aisle]
        if last:
            assert mark(pg_warehouse, aisle).endswith(f":{last[-1]}")


def test_a_paused_pg_robot_s_late_write_is_refused_by_the_database(pg_warehouse: dict) -> None:
    aisle = f"py-{uuid.uuid4().hex[:10]}"
    # --careless: no lease.lost check before writing, so the late write is sure to be sent
    robot = start(
        pg_warehouse, "--aisles", aisle, "--name", "old", "--ttl", "2", "--rounds", "1",
        "--updates", "40", "--count-time", "1.0", "--careless",
    )
    old_token = int(robot.expect("event acquired").split()[3])
    pause_between_writes(pg_warehouse, robot)
    try:
        grant = take_over(pg_warehouse["proxy"], aisle, "new")
        assert int(grant["token"]) > old_token
        # the new holder writes through the inventory, fenced by the same marks
        assert put_count(pg_warehouse, aisle, grant["fencing_token"], "new").status_code == 200
    finally:
        robot.process.send_signal(signal.SIGCONT)
    robot.expect(f"event stale-db {aisle}")
    seen = robot.finish()
    assert not any(s.startswith("event write-ok") for s in seen[seen.index(f"event stale-db {aisle}") :]), seen
    written = rows(pg_warehouse, [aisle])
    new_rows = [r for r in written if r[2] == "new"]
    assert [r[3] for r in new_rows] == [int(grant["token"])], written
    # no row of the old token after the new holder's first
    assert all(r[3] == old_token and r[0] < new_rows[0][0] for r in written if r[2] == "old"), written
    assert any(r[2] == "old" for r in written), written


def test_the_inventory_presents_the_token_to_the_database(pg_warehouse: dict) -> None:
    """The inventory's own writes (what fence-gateway forwards from the Rust robots) are fenced
    by the database: a superseded token is refused with 409, as the gateway answers it."""
    aisle = f"py-{uuid.uuid4().hex[:10]}"
    first = httpx.post(f"{pg_warehouse['proxy']}/v1/leases/{aisle}", json={"holder": "a", "ttl_seconds": 10}).json()
    httpx.delete(f"{pg_warehouse['proxy']}/v1/leases/{aisle}", headers={"lease-secret": first["secret"]})
    second = take_over(pg_warehouse["proxy"], aisle, "b")
    assert put_count(pg_warehouse, aisle, second["fencing_token"], "b").status_code == 200
    stale = put_count(pg_warehouse, aisle, first["fencing_token"], "a")
    assert stale.status_code == 409 and stale.json()["type"].endswith("/stale-fencing-token"), stale.text
    other = put_count(pg_warehouse, aisle, take_over(pg_warehouse["proxy"], f"{aisle}-x", "c")["fencing_token"], "c")
    assert other.status_code == 403, other.text  # a genuine token of another aisle
    assert [(r[2], r[3]) for r in rows(pg_warehouse, [aisle])] == [("b", int(second["token"]))]


def test_a_write_held_up_on_one_aisle_holds_up_no_other_and_answers_503_once_late(pg_warehouse: dict) -> None:
    """The inventory writes on a pool, each write within ``--db-timeout`` (5 s here): while one
    aisle's mark row is locked (as an old holder's open raise holds it), another aisle's write
    goes through, and the held one is answered 503 at its deadline, rolled back."""
    name = f"py-{uuid.uuid4().hex[:10]}"
    held, free = f"{name}-held", f"{name}-free"
    grants = {a: take_over(pg_warehouse["proxy"], a, "h") for a in (held, free)}
    with psycopg.connect(pg_warehouse["db"]) as blocker:  # a transaction, left open
        blocker.execute("SELECT 1 FROM fencing.fence_marks WHERE resource = %s FOR UPDATE", [held])
        with ThreadPoolExecutor(1) as pool:
            late = pool.submit(put_count, pg_warehouse, held, grants[held]["fencing_token"], "h")
            wait_until(lambda: waiting_on_a_lock(pg_warehouse) == 1, 10, "the held write")
            # on one connection for every write, this one would wait behind the held one
            other = put_count(pg_warehouse, free, grants[free]["fencing_token"], "h")
            assert other.status_code == 200, other.text
            assert waiting_on_a_lock(pg_warehouse) == 1 and not late.done()
            answer = late.result()
        assert answer.status_code == 503, answer.text
        assert answer.json()["type"].endswith("/storage-unavailable"), answer.text
        blocker.rollback()
    assert [r[1] for r in rows(pg_warehouse, [held, free])] == [free]
    again = put_count(pg_warehouse, held, grants[held]["fencing_token"], "h")
    assert again.status_code == 200, again.text
