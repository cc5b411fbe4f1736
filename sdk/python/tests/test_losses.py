"""The loss watch: a guard learns of its loss when the proxy sees it (its etcd lease revoked, a
takeover, its session's lease revoked), within a second and long before its next renewal (TTL 30
s: the renewal is 10 s away); an older grant's event never ends a newer grant; and the book's
decisions without a proxy. The times measured are printed (``-s`` shows them)."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from conftest import Etcd
from lease_proxy_client import AsyncClient, Client
from lease_proxy_client.losses import EXPIRED, RELEASED, TAKEN_OVER, Book, earliest, loss

# The loss must be told within this of the change at the proxy.
WITHIN = 1.0
TTL = 30


def test_an_event_ends_only_the_grant_whose_token_it_carries_or_a_later_grant() -> None:
    assert loss("released", 7, 7) == RELEASED
    assert loss("expired", 7, 7) == EXPIRED
    assert loss("acquired", 9, 7) == TAKEN_OVER
    for kind, event in (("released", 5), ("expired", 5), ("acquired", 5), ("acquired", 7), ("expired", 9)):
        assert loss(kind, event, 7) is None, (kind, event)
    book: Book[str] = Book()
    book.register("aisle-1", 10, "a1")
    book.register("aisle-2", 12, "a2")
    assert book.see("aisle-1", "expired", 4) == [] and book.see("aisle-9", "expired", 10) == []
    assert book.see("aisle-1", "expired", 10) == [("a1", EXPIRED)]
    assert book.see("aisle-2", "acquired", 20) == [("a2", TAKEN_OVER)]
    assert book.is_empty()
    # A grant registered after its end was read is lost at once.
    assert book.register("aisle-1", 10, "late")[1] == EXPIRED
    assert book.register("aisle-2", 15, "late")[1] == TAKEN_OVER
    assert book.register("aisle-2", 21, "new")[1] is None
    # The stream wanted: the common prefix, from the smallest token; resumed from the earlier point.
    book.register("aisle-14", 18, "b")
    assert book.wanted() == ("aisle-", 18)
    assert earliest("30.1", 12) == "12" and earliest("30.1", 40) == "30.1" and earliest(None, 7) == "7"


def _revoke_after_stream_opened(etcd: Etcd, lease_id: str) -> float:
    time.sleep(0.3)  # the stream is open
    revoked = time.monotonic()
    etcd.revoke(lease_id)
    return revoked


def test_a_revoked_lease_is_lost_within_a_second_not_at_the_next_renewal(
    proxy: str, etcd: Etcd, resource: str
) -> None:
    with Client(proxy) as client:
        lease = client.acquire(resource, ttl=TTL, holder="revoked")
        revoked = _revoke_after_stream_opened(etcd, lease.lease_id)
        assert lease.lost.wait(WITHIN), "not told within 1 s of the revoke"
        took = time.monotonic() - revoked
        assert lease.lost_reason == "revoked"
        print(f"sync: revoke in etcd -> lost {took * 1000:.0f} ms")

        # A takeover: the holder's lease revoked, another client acquiring at once.
        held = client.acquire(resource + "-t", ttl=TTL, holder="held")
        time.sleep(0.3)
        revoked = time.monotonic()
        etcd.revoke(held.lease_id)
        taken = httpx.post(
            f"{proxy}/v1/leases/{resource}-t", json={"holder": "taker", "ttl_seconds": TTL, "wait_ms": 5000}
        )
        assert taken.status_code == 201, taken.text
        assert held.lost.wait(WITHIN)
        took = time.monotonic() - revoked
        print(f"sync: revoke + takeover -> lost {took * 1000:.0f} ms after the revoke")

        # An older grant's end never ends a newer grant of the same resource.
        for _ in range(3):
            first = client.acquire(resource, ttl=TTL, holder="again")
            first.release()
            second = client.acquire(resource, ttl=TTL, holder="again")
            assert not second.lost.wait(0.5), "the first grant's release ended the second"
            second.release()


def test_a_revoked_session_is_lost_with_its_leases_within_a_second(
    proxy: str, etcd: Etcd, resource: str
) -> None:
    with Client(proxy) as client, client.session(holder="robot", ttl=TTL) as session:
        lease = session.acquire(resource)
        revoked = _revoke_after_stream_opened(etcd, session.id)
        assert lease.lost.wait(WITHIN), "not told within 1 s of the revoke"
        print(f"sync: session revoke -> lease lost {(time.monotonic() - revoked) * 1000:.0f} ms")
        assert session.lost_reason == "revoked" and lease.lost_reason == "session-lost"


def test_without_the_watch_the_renewal_tells(proxy: str, etcd: Etcd, resource: str) -> None:
    with Client(proxy, loss_watch=False) as client:
        lease = client.acquire(resource, ttl=3, holder="renewing")
        etcd.revoke(lease.lease_id)
        assert not lease.lost.wait(0.5), "told without a stream: the control is broken"
        assert lease.lost.wait(3.0) and lease.lost_reason == "revoked"


@pytest.mark.asyncio
async def test_async_a_revoked_lease_is_lost_within_a_second(proxy: str, etcd: Etcd, resource: str) -> None:
    async with AsyncClient(proxy) as client:
        lease = await client.acquire(resource, ttl=TTL, holder="revoked")
        await asyncio.sleep(0.3)
        revoked = time.monotonic()
        await asyncio.to_thread(etcd.revoke, lease.lease_id)
        await asyncio.wait_for(lease.lost.wait(), WITHIN)
        print(f"async: revoke in etcd -> lost {(time.monotonic() - revoked) * 1000:.0f} ms")
        assert lease.lost_reason == "revoked"
        async with client.session(holder="robot", ttl=TTL) as session:
            held = await session.acquire(resource + "-s")
            await asyncio.sleep(0.3)
            revoked = time.monotonic()
            await asyncio.to_thread(etcd.revoke, session.id)
            await asyncio.wait_for(held.lost.wait(), WITHIN)
            print(f"async: session revoke -> lease lost {(time.monotonic() - revoked) * 1000:.0f} ms")
            assert session.lost_reason == "revoked" and held.lost_reason == "session-lost"
        first = await client.acquire(resource, ttl=TTL, holder="again")
        await first.release()
        second = await client.acquire(resource, ttl=TTL, holder="again")
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(second.lost.wait(), 0.5)
        await second.release()
