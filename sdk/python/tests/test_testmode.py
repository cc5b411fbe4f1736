"""The test mode: the client against the in-memory :class:`FakeProxy` (no proxy running) —
grants renewed past their TTL, released, refused while held, taken by the next holder with a
larger token, expired at their TTL when not renewed, and lost when the test says so (leases,
sessions, the asyncio client) — and the injected faults, against the fake and once against a real
proxy — the token refusals of ``forward`` and ``admit`` included. Also an application's own tests
of its on-lost and on-refused paths, as the README shows them."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import List, Tuple

import pytest

from lease_proxy_client import AsyncClient, Client, FakeProxy, Held, InjectedRefusal, Lost, TestMode, admit
from lease_proxy_client.testmode import FAILED_RENEWAL, LATE_RENEWAL, LOSS, TOKEN_REFUSAL, Faults

TTL = 3  # renewals come about a second in
WITHIN = 5.0


def fake_client(fake: FakeProxy, **mode: object) -> Client:
    return Client(test_mode=TestMode(fake=fake, **mode))  # type: ignore[arg-type]


def test_a_lease_is_renewed_past_its_ttl_and_released_without_a_proxy(resource: str) -> None:
    fake = FakeProxy()
    with fake_client(fake) as client, fake_client(fake) as other:
        lease = client.acquire(resource, ttl=1, holder="me", metadata={"aisle": 3})
        time.sleep(2.5)  # several renewals, well past the TTL
        assert not lease.lost.is_set(), lease.lost_reason
        holding = other.get(resource)
        assert holding is not None
        assert (holding.holder, holding.token, holding.metadata) == ("me", lease.token, {"aisle": 3})
        with pytest.raises(Held) as held:
            other.acquire(resource, ttl=1, holder="other")
        assert (held.value.holder, held.value.token) == ("me", lease.token)
        lease.release()
        assert lease.lost_reason == "released" and other.get(resource) is None
        after = other.acquire(resource, ttl=1, holder="other")
        assert after.token > lease.token and after.fencing_token != lease.fencing_token
        after.release()


def test_a_waiting_acquire_is_granted_when_the_holder_releases(resource: str) -> None:
    fake = FakeProxy()
    with fake_client(fake) as client:
        first = client.acquire(resource, ttl=TTL, holder="first")
        threading.Timer(0.3, first.release).start()
        second = client.acquire(resource, ttl=TTL, holder="second", wait=WITHIN)
        assert second.token > first.token and first.lost_reason == "released"
        second.release()


def test_a_lease_not_renewed_expires_at_its_ttl(resource: str) -> None:
    fake = FakeProxy()
    ttl = 2
    with fake_client(fake, failed_renewal_rate=1.0) as client, fake_client(fake) as other:
        start = time.monotonic()
        lease = client.acquire(resource, ttl=ttl, holder="unreachable")
        assert lease.lost.wait(WITHIN)
        assert lease.lost_reason == "expired" and time.monotonic() >= lease.deadline
        assert time.monotonic() - start < ttl  # stop-by: before the proxy's expiry
        next_holder = other.acquire(resource, ttl=ttl, holder="next", wait=WITHIN)
        assert time.monotonic() - start >= ttl, "granted before the first grant's TTL ran out"
        assert next_holder.token > lease.token
        next_holder.release()


def test_a_lease_lost_by_the_test_is_lost_as_a_revoked_one(resource: str) -> None:
    fake = FakeProxy()
    with fake_client(fake) as client:
        lease = client.acquire(resource, ttl=TTL, holder="me")
        assert fake.lose(resource) and not fake.lose(resource)
        assert lease.lost.wait(WITHIN), "the loss was not learnt at the next renewal"
        assert (lease.lost_reason, lease.lost_injected) == ("revoked", False)
        with pytest.raises(Lost):
            lease.forward("GET", "anything")
        again = client.acquire(resource, ttl=TTL, holder="me")
        assert again.token > lease.token
        again.release()


def test_a_session_lost_by_the_test_loses_its_leases(resource: str) -> None:
    fake = FakeProxy()
    with fake_client(fake) as client:
        session = client.session(holder="me", ttl=TTL)
        lease = session.acquire(resource)
        other = session.acquire(resource + "-2")
        assert fake.lose(resource)
        assert lease.lost.wait(WITHIN) and other.lost.wait(WITHIN)
        assert (session.lost_reason, lease.lost_reason) == ("revoked", "session-lost")
        assert client.get(resource + "-2") is None


def test_an_injected_loss_against_the_fake(resource: str) -> None:
    fake = FakeProxy()
    faults: List[Tuple[str, str]] = []
    with fake_client(fake, loss_rate=1.0, on_fault=lambda kind, path: faults.append((kind, path))) as client:
        lease = client.acquire(resource, ttl=TTL, holder="buggified")
        assert lease.lost.wait(WITHIN), "no loss injected at the first renewal"
        assert (lease.lost_reason, lease.lost_injected) == ("revoked", True)
        assert faults == [(LOSS, f"/v1/leases/{resource}/renew")]
        assert client.get(resource) is None, "the grant was not released"
        session = client.session(holder="buggified", ttl=TTL)
        under = session.acquire(resource)
        assert under.lost.wait(WITHIN)
        assert (session.lost_injected, under.lost_reason, under.lost_injected) == (True, "session-lost", True)


def test_an_injected_loss_reaches_the_lease_as_a_refusal_would(proxy: str, resource: str) -> None:
    """The faults need no fake: against a real proxy the injected loss releases the grant there."""
    with Client(proxy, test_mode=TestMode(loss_rate=1.0)) as client, Client(proxy) as plain:
        lease = client.acquire(resource, ttl=TTL, holder="buggified")
        assert lease.lost.wait(WITHIN)
        assert (lease.lost_reason, lease.lost_injected) == ("revoked", True)
        deadline = time.monotonic() + WITHIN
        while plain.get(resource) is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert plain.get(resource) is None, "the grant was not released at the proxy"
        # Without the test mode, nothing is injected.
        held = plain.acquire(resource, ttl=TTL, holder="plain")
        time.sleep(1.5)  # past its first renewal
        assert not held.lost.is_set() and not held.lost_injected
        held.release()


def test_a_late_renewal_is_told_and_a_seed_repeats_the_draws(resource: str) -> None:
    told = threading.Event()
    mode = dict(late_renewal_rate=1.0, seed=3, on_fault=lambda kind, path: told.set())
    with fake_client(FakeProxy(), **mode) as client:
        lease = client.acquire(resource, ttl=TTL, holder="late")
        assert told.wait(WITHIN)
        lease.release()

    def draws(seed: int) -> List[bool]:
        faults = Faults(TestMode(loss_rate=0.5, seed=seed))
        return [faults.fires(LOSS, "p") for _ in range(32)]

    assert draws(7) == draws(7) and draws(7) != draws(8)
    assert not Faults(None).fires(LATE_RENEWAL, "p") and not Faults(TestMode()).fires(FAILED_RENEWAL, "p")


@pytest.mark.asyncio
async def test_async_a_lease_lost_by_the_test_and_an_injected_loss(resource: str) -> None:
    fake = FakeProxy()
    async with AsyncClient(test_mode=TestMode(fake=fake)) as client:
        lease = await client.acquire(resource, ttl=TTL, holder="me")
        assert fake.lose(resource)
        await asyncio.wait_for(lease.lost.wait(), WITHIN)
        assert (lease.lost_reason, lease.lost_injected) == ("revoked", False)
        again = await client.acquire(resource, ttl=TTL, holder="me")
        assert again.token > lease.token
        await again.release()
    async with AsyncClient(test_mode=TestMode(fake=fake, loss_rate=1.0)) as client:
        lease = await client.acquire(resource, ttl=TTL, holder="buggified")
        await asyncio.wait_for(lease.lost.wait(), WITHIN)
        assert (lease.lost_reason, lease.lost_injected) == ("revoked", True)


def count_aisle(client: Client, resource: str, counts: List[int]) -> str:
    """An application's work: writes up to 100 counts under the lease, stopping if it is lost."""
    with client.lease(resource, ttl=TTL, holder="robot") as lease:
        for _ in range(100):
            if lease.lost.is_set():
                return f"stopped: {lease.lost_reason}"
            counts.append(lease.token)
            time.sleep(0.05)
        return "done"


def test_an_applications_on_lost_path_runs_without_a_proxy(resource: str) -> None:
    fake = FakeProxy()
    counts: List[int] = []
    with Client(test_mode=TestMode(fake=fake)) as client:
        threading.Timer(0.5, fake.lose, args=(resource,)).start()
        assert count_aisle(client, resource, counts) == "stopped: revoked"
        written = len(counts)
        time.sleep(0.2)
        assert 0 < written == len(counts), "written after the loss"


class Cursor:
    """A DB-API cursor that records what it is asked (the database's ``fencing.admit``)."""

    def __init__(self) -> None:
        self.executed: List[Tuple[str, Tuple[str, str]]] = []

    def execute(self, sql: str, params: Tuple[str, str]) -> None:
        self.executed.append((sql, params))

    def fetchone(self) -> Tuple[str]:
        return ("1:7",)


def test_an_injected_token_refusal_answers_forward_and_admit_without_sending(resource: str) -> None:
    fake = FakeProxy()
    faults: List[Tuple[str, str]] = []
    with fake_client(fake, token_refusal_rate=1.0, on_fault=lambda kind, path: faults.append((kind, path))) as client:
        lease = client.acquire(resource, ttl=TTL, holder="refused")
        # forward: fence-gateway's 409, as a newer holder's mark would give (the fake serves no
        # forward at all: nothing was sent).
        response = lease.forward("PUT", f"aisles/{resource}/count", json={"count": 1})
        assert response.status_code == 409
        assert response.headers["fencing-rejection"] == "stale-fencing-token"
        problem = response.json()
        assert problem["type"].endswith("/stale-fencing-token") and problem["injected"] is True
        # admit: PostgreSQL's 23F01, without a query.
        cursor = Cursor()
        with pytest.raises(InjectedRefusal) as refused:
            admit(cursor, lease)
        assert refused.value.sqlstate == "23F01" and cursor.executed == []
        assert faults == [(TOKEN_REFUSAL, resource), (TOKEN_REFUSAL, resource)]
        # A refused write loses nothing: the lease is still held.
        assert not lease.lost.is_set()
        lease.release()
    # Without the fault, both are sent.
    with fake_client(fake, loss_rate=0.0) as client:
        lease = client.acquire(resource, ttl=TTL, holder="plain")
        assert lease.forward("PUT", "anything").status_code == 404  # the fake's: it was sent
        cursor = Cursor()
        assert admit(cursor, lease) == "1:7" and cursor.executed == [
            ("SELECT fencing.admit(%s, %s)", (resource, lease.fencing_token))
        ]
        lease.release()

    def draws(seed: int) -> List[bool]:
        dice = Faults(TestMode(token_refusal_rate=0.5, seed=seed))
        return [dice.fires(TOKEN_REFUSAL, "r") for _ in range(32)]

    assert draws(5) == draws(5) and True in draws(5) and False in draws(5)


@pytest.mark.asyncio
async def test_async_an_injected_token_refusal_answers_forward(resource: str) -> None:
    async with AsyncClient(test_mode=TestMode(fake=FakeProxy(), token_refusal_rate=1.0)) as client:
        lease = await client.acquire(resource, ttl=TTL, holder="refused")
        response = await lease.forward("PUT", f"aisles/{resource}/count", json={"count": 1})
        assert response.status_code == 409 and response.json()["injected"] is True
        await lease.release()


def write_counts(client: Client, resource: str, counts: List[int]) -> str:
    """An application's work: writes counts under the lease, stopping once a write is refused
    (a newer holder has written: this one is not the holder any more)."""
    with client.lease(resource, ttl=TTL, holder="robot") as lease:
        for count in range(100):
            response = lease.forward("PUT", f"aisles/{resource}/count", json={"count": count})
            if response.status_code == 409:
                return f"stopped: {response.headers.get('fencing-rejection')}"
            counts.append(count)
        return "done"


def test_an_applications_on_refused_path_runs_without_a_proxy(resource: str) -> None:
    counts: List[int] = []
    with Client(test_mode=TestMode(fake=FakeProxy(), token_refusal_rate=1.0)) as client:
        assert write_counts(client, resource, counts) == "stopped: stale-fencing-token"
    assert counts == []
