"""The sync lease guard against a real proxy and etcd."""

from __future__ import annotations

import gc
import sys
import threading
import time
from typing import Dict

import httpx
import pytest

from conftest import Etcd, Upstream, take_over
from lease_proxy_client import Client, Held, Lost, TransportError

# How late after its deadline a lost signal may be observed (thread scheduling on a busy machine).
SLACK = 0.5


def test_renewals_keep_the_lease_past_its_ttl(proxy: str, resource: str) -> None:
    with Client(proxy) as client, client.lease(resource, ttl=2, holder="steady") as lease:
        first_deadline = lease.deadline
        time.sleep(3.5)
        assert not lease.lost.is_set()
        assert lease.lost_reason is None
        assert lease.deadline > first_deadline + 1.0
        holding = client.get(resource)
        assert holding is not None and holding.token == lease.token and holding.holder == "steady"


def test_release_on_exit_frees_the_resource_even_on_an_exception(proxy: str, resource: str) -> None:
    with Client(proxy) as client:
        with pytest.raises(RuntimeError):
            with client.lease(resource, ttl=10, holder="crashy") as lease:
                assert client.get(resource) is not None
                raise RuntimeError("the work failed")
        assert client.get(resource) is None
        assert lease.lost_reason == "released"
        lease.release()  # idempotent


def test_a_lease_dropped_without_release_stops_renewing_and_ends_at_its_ttl(
    proxy: str, resource: str
) -> None:
    with Client(proxy) as client:
        lease = client.acquire(resource, ttl=2, holder="forgetful")
        deadline = lease.deadline
        del lease
        gc.collect()
        time.sleep(max(deadline - time.monotonic(), 0) + 1.5)
        assert client.get(resource) is None


def test_a_client_closed_under_a_lease_lets_it_expire_quietly(
    proxy: str, resource: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    crashes: list = []
    monkeypatch.setattr(threading, "excepthook", crashes.append)
    client = Client(proxy)
    lease = client.acquire(resource, ttl=2, holder="orphaned")
    client.close()
    assert lease.lost.wait(timeout=lease.deadline - time.monotonic() + SLACK)
    assert lease.lost_reason == "expired"
    assert crashes == []


def test_a_held_resource_raises_held_with_the_holder(proxy: str, resource: str) -> None:
    with Client(proxy) as client, client.lease(resource, ttl=10, holder="first") as lease:
        with pytest.raises(Held) as held:
            client.acquire(resource, ttl=10, holder="second")
        assert held.value.holder == "first"
        assert held.value.token == lease.token
        assert 0 < held.value.expires_in_ms <= 10_000


def _take_over_concurrently(proxy: str, resource: str, lease, results: Dict[str, object]) -> threading.Thread:
    """Polls a takeover in a thread; on winning records the grant and whether the watchdog had
    already set the lost signal (the bare flag, not the deadline check of ``is_set``)."""

    def run() -> None:
        _, grant = take_over(proxy, resource, "usurper", 5, within=20)
        results["flag_set_at_takeover"] = threading.Event.is_set(lease.lost)
        results["is_set_at_takeover"] = lease.lost.is_set()
        results["grant"] = grant

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_lost_fires_by_the_deadline_when_renewals_stop_and_another_takes_over(
    proxy: str, resource: str
) -> None:
    with Client(proxy) as client:
        client._renewals_paused.set()  # as if the process were SIGSTOPped
        lease = client.acquire(resource, ttl=2, holder="paused")
        deadline = lease.deadline
        results: Dict[str, object] = {}
        usurper = _take_over_concurrently(proxy, resource, lease, results)
        # the watchdog sets lost at the deadline, whatever the renewals do
        assert lease.lost.wait(timeout=deadline - time.monotonic() + SLACK), "lost not set by the deadline"
        lost_at = time.monotonic()
        assert lost_at <= deadline + SLACK
        assert lease.lost_reason == "expired"
        usurper.join()
        # nobody else got the resource before this holder knew it had lost it
        assert results["flag_set_at_takeover"] is True
        assert lease.token < int(results["grant"]["token"])  # type: ignore[index]
        with pytest.raises(Lost):
            lease.forward("PUT", "anything", content=b"zombie write")
        client._renewals_paused.clear()
        lease.release()  # a no-op for the proxy: the grant is someone else's now
        holding = client.get(resource)
        assert holding is not None and holding.holder == "usurper"


def test_a_process_resumed_past_its_deadline_sees_lost_before_acting(proxy: str, resource: str) -> None:
    with Client(proxy) as client:
        lease = client.acquire(resource, ttl=2, holder="frozen")
        deadline = lease.deadline
        # Keep the GIL past the deadline so that no other thread (watchdog, renewer) runs: as if
        # the process had been frozen; this thread is the first to run when it "resumes".
        interval = sys.getswitchinterval()
        sys.setswitchinterval(60.0)
        try:
            while time.monotonic() < deadline + 0.2:
                pass
            seen = lease.lost.is_set()
        finally:
            sys.setswitchinterval(interval)
        assert seen, "a frozen holder resumed past its deadline must see lost first"
        assert lease.lost_reason == "expired"
        lease.release()


def test_deadline_counts_from_before_the_request_was_sent(proxy: str, relay, resource: str) -> None:
    # The proxy's answers reach the client 1.5 s late: a deadline counted from the answer's
    # arrival would be 1.5 s too late, and another holder would get the resource first.
    slow = relay(delay=1.5)
    with Client(slow.url) as client:
        client._renewals_paused.set()
        before = time.monotonic()
        lease = client.acquire(resource, ttl=2, holder="slow-link")
        assert lease.deadline < before + lease.grant.expires_in_ms / 1000.0 + 0.5  # not + 1.5 s
        results: Dict[str, object] = {}
        usurper = _take_over_concurrently(proxy, resource, lease, results)
        usurper.join()
        assert (
            results["is_set_at_takeover"] is True
        ), "another holder got the resource while this one still held it"
        assert lease.lost_reason == "expired"


def test_lost_fires_when_etcd_loses_the_lease(proxy: str, etcd: Etcd, resource: str) -> None:
    # The renewal's 410, not the loss watch (test_losses.py), tells here.
    with Client(proxy, loss_watch=False) as client, client.lease(resource, ttl=6, holder="revoked") as lease:
        etcd.revoke(lease.lease_id)
        # the next renewal (a third of the TTL in) gets 410: lost long before the deadline
        assert lease.lost.wait(timeout=lease.deadline - time.monotonic()), "lost not set before the deadline"
        lost_at = time.monotonic()
        assert lost_at < lease.deadline - 2.0
        assert lease.lost_reason == "revoked"
        with pytest.raises(Lost):
            client.renew(resource, lease.secret)


def test_forward_carries_the_fencing_token_upstream(proxy: str, upstream: Upstream, resource: str) -> None:
    with Client(proxy) as client, client.lease(resource, ttl=10, holder="writer") as lease:
        response = lease.forward("PUT", f"/items/{resource}", json={"count": 3}, params={"v": "1"})
        assert response.status_code == 200 and response.text == "ok"
    seen = [r for r in upstream.requests if r.path.startswith(f"/items/{resource}")]
    assert len(seen) == 1
    assert seen[0].method == "PUT" and seen[0].path == f"/items/{resource}?v=1"
    assert seen[0].headers["fencing-token"] == lease.fencing_token
    assert seen[0].headers["fencing-resource"] == resource
    assert "lease-secret" not in seen[0].headers
    assert seen[0].body == b'{"count":3}'


def test_wait_queues_until_the_holder_releases(proxy: str, resource: str) -> None:
    with Client(proxy) as client:
        first = client.acquire(resource, ttl=10, holder="first")
        threading.Timer(0.7, first.release).start()
        started = time.monotonic()
        with client.lease(resource, ttl=10, holder="second", wait=8.0) as second:
            assert time.monotonic() - started >= 0.5
            assert second.token > first.token
            assert first.lost_reason == "released"


def test_an_acquire_whose_answer_is_lost_is_retried_with_its_idempotency_key(
    proxy: str, relay, resource: str
) -> None:
    flaky = relay(drop_first=True)
    with Client(flaky.url, timeout=5.0) as client:
        with client.lease(resource, ttl=10, holder="retrier", idempotency_key=f"key-{resource}") as lease:
            assert flaky.connections >= 2  # the first answer was lost
            holding = client.get(resource)
            assert holding is not None and holding.token == lease.token  # one grant, not two
    flaky_again = relay(drop_first=True)
    with Client(flaky_again.url, timeout=5.0) as client:
        with pytest.raises(TransportError):
            client.acquire(resource, ttl=2, holder="no-key")  # without a key: not retried
        holding = client.get(resource)
        # the orphan a key prevents: its secret was in the lost answer, it can only expire
        assert holding is not None and holding.holder == "no-key"


def test_one_shots_and_listing(proxy: str, resource: str) -> None:
    with Client(proxy) as client:
        grants = [
            client.grant(f"{resource}-{i}", ttl=10, holder=f"h{i}", metadata={"i": i}) for i in range(3)
        ]
        renewal = client.renew(grants[0].resource, grants[0].secret)
        assert renewal.token == grants[0].token and renewal.ttl_seconds == 10
        listed = client.list(prefix=resource, page_size=1)  # three pages, cursors followed
        assert [h.resource for h in listed] == [g.resource for g in grants]
        assert [h.token for h in listed] == [g.token for g in grants]
        assert [h.metadata for h in listed] == [{"i": 0}, {"i": 1}, {"i": 2}]
        for g in grants:
            client.release(g.resource, g.secret)
            client.release(g.resource, g.secret)  # idempotent
        assert client.list(prefix=resource) == []
        with pytest.raises(Lost):
            client.renew(grants[0].resource, grants[0].secret)
        assert client.get(resource + "-0") is None


def test_problems_carry_the_proxy_answer(proxy: str) -> None:
    from lease_proxy_client import Problem

    with Client(proxy) as client:
        with pytest.raises(Problem) as bad:
            client.acquire("not a valid name", ttl=10, holder="x")
        assert bad.value.status == 400 and bad.value.slug == "invalid-resource"
    assert httpx.get(f"{proxy}/livez").status_code == 200


def test_the_stop_by_deadline_keeps_a_safety_margin_before_the_servers_expiry(
    proxy: str, resource: str
) -> None:
    with Client(proxy) as client, Client(proxy, safety_margin=1.0) as wide:
        client._renewals_paused.set()
        wide._renewals_paused.set()
        before = time.monotonic()
        a = client.acquire(resource + "-a", ttl=3, holder="margin")
        b = wide.acquire(resource + "-b", ttl=3, holder="margin")
        after = time.monotonic()
        for lease, margin in ((a, 0.3), (b, 1.0)):  # the default: a tenth of the lifetime
            life = min(lease.grant.expires_in_ms / 1000.0, 3.0)
            assert before + life - margin - 1e-6 <= lease.deadline <= after + life - margin + 1e-6
        # No renewal: b is lost ("expired") at its stop-by deadline, while the proxy still holds
        # it — nobody else can have it yet.
        assert b.lost.wait(timeout=b.deadline - time.monotonic() + SLACK)
        assert b.lost_reason == "expired"
        assert client.get(resource + "-b") is not None, "the margin was not kept"
        a.release()
        b.release()
