"""Tokens to the storage without application code: ``FencingAuth`` on an httpx request through a
real fence-gateway (header mode) in front of the recording upstream — the lease's token and
resource reach the storage, a forged ``X-Fencing-Token`` is dropped, the old holder's late write
is refused 409 once a newer holder wrote, a lost lease sends nothing; and ``admit`` over a
DB-API cursor (the SQL sent, a lost lease refused without a query). ``admit`` against
PostgreSQL's package: ``test_pg_fencing.py``."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Iterator, List, Tuple

import httpx
import pytest

from conftest import Etcd, Upstream, free_port, stop, wait_until
from lease_proxy_client import Client, FencingAuth, Lost, admit
from test_robot_example import binary, spawn


@pytest.fixture(scope="module")
def gateway(workdir: Path, key_file: Path, upstream: Upstream) -> Iterator[str]:
    """fence-gateway in header mode in front of ``upstream``, with the proxy's keys."""
    url = f"http://127.0.0.1:{free_port()}"
    log = workdir / "propagation-gateway.log"
    process = spawn(
        [
            binary("FENCE_GATEWAY_BIN", "fence-gateway"),
            "--listen",
            url[7:],
            "--upstream",
            upstream.url,
            "--store",
            "memory",
            "--key-file",
            str(key_file),
        ],
        log,
    )
    try:
        wait_until(lambda: httpx.get(f"{url}/readyz", timeout=1).status_code == 200, 30, "fence-gateway", log)
        yield url
    finally:
        stop(process)


def test_fencing_auth_carries_the_token_and_the_gateway_refuses_the_old_holder(
    proxy: str, etcd: Etcd, gateway: str, upstream: Upstream, resource: str
) -> None:
    # No loss watch for the old holder: it must still believe it holds when it writes late.
    with Client(proxy, loss_watch=False) as old_client, Client(proxy) as new_client:
        old = old_client.acquire(resource, ttl=30, holder="old")
        answer = httpx.put(
            f"{gateway}/items/{resource}",
            json={"by": "old"},
            auth=FencingAuth(old),
            headers={"X-Fencing-Token": "v1.forged"},
        )
        assert answer.status_code == 200, answer.text
        seen = upstream.requests[-1].headers
        assert seen["fencing-resource"] == resource, seen

        etcd.revoke(old.lease_id)
        new = new_client.acquire(resource, ttl=30, holder="new", wait=5)
        assert new.token > old.token

        async def write_async() -> int:
            async with httpx.AsyncClient(auth=FencingAuth(new)) as http:
                return (await http.put(f"{gateway}/items/{resource}", json={"by": "new"})).status_code

        assert asyncio.run(write_async()) == 200
        assert not old.lost.is_set()  # its renewal is 10 s away: only the storage can tell
        late = httpx.put(f"{gateway}/items/{resource}", json={"by": "old"}, auth=FencingAuth(old))
        assert late.status_code == 409 and late.json()["type"].endswith("stale-fencing-token"), late.text

        new.release()
        before = len(upstream.requests)
        with pytest.raises(Lost):
            httpx.put(f"{gateway}/items/{resource}", json={"by": "new"}, auth=FencingAuth(new))
        assert len(upstream.requests) == before


class Cursor:
    """A DB-API cursor that records what it is asked."""

    def __init__(self) -> None:
        self.executed: List[Tuple[str, Any]] = []

    def execute(self, sql: str, params: Any) -> None:
        self.executed.append((sql, params))

    def fetchone(self) -> Tuple[str]:
        return ("0:42",)


class Connection:
    def __init__(self) -> None:
        self.made = Cursor()

    def cursor(self) -> Cursor:
        return self.made


def test_admit_sends_the_leases_token_and_nothing_once_it_is_lost(proxy: str, resource: str) -> None:
    with Client(proxy) as client:
        lease = client.acquire(resource, ttl=30, holder="admit")
        cursor, connection = Cursor(), Connection()
        assert admit(cursor, lease) == "0:42"
        assert admit(connection, lease) == "0:42"
        sent = ("SELECT fencing.admit(%s, %s)", (resource, lease.fencing_token))
        assert cursor.executed == [sent] and connection.made.executed == [sent]
        lease.release()
        with pytest.raises(Lost):
            admit(cursor, lease)
        assert len(cursor.executed) == 1
