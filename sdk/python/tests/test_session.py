"""Sessions (sync): one heartbeat for many leases, all lost together."""

from __future__ import annotations

import threading
import time

import pytest

from conftest import Etcd, take_over
from lease_proxy_client import Client, SessionLost

SLACK = 0.5


def test_leases_under_a_session_outlive_its_ttl_and_close_with_it(proxy: str, resource: str) -> None:
    with Client(proxy) as client:
        with client.session(holder="robot-s", ttl=2) as session:
            a = session.lease(resource + "-a")
            b = session.lease(resource + "-b", holder="robot-s/arm")
            assert a.session_id == session.id and a.lease_id == session.id
            time.sleep(3.0)  # past the TTL: the heartbeat keeps both
            assert not a.lost.is_set() and not b.lost.is_set()
            assert b.deadline == session.deadline
            held = client.get(resource + "-b")
            assert held is not None and held.holder == "robot-s/arm" and held.session == session.id
            a.release()  # one resource only
            assert client.get(resource + "-a") is None
            assert client.get(resource + "-b") is not None
            assert a.lost_reason == "released" and b.lost_reason is None
        assert session.lost_reason == "released"
        assert b.lost_reason == "released"
        assert client.get(resource + "-b") is None
        with pytest.raises(SessionLost):
            session.acquire(resource + "-c")


def test_session_loss_in_etcd_reaches_its_leases_before_the_deadline(
    proxy: str, etcd: Etcd, resource: str
) -> None:
    # The keepalive's 410, not the loss watch (test_losses.py), tells here.
    with Client(proxy, loss_watch=False) as client, client.session(holder="revoked", ttl=6) as session:
        lease = session.lease(resource)
        etcd.revoke(session.id)
        # the next keepalive (a third of the TTL in) gets 410 session-lost
        assert lease.lost.wait(
            timeout=session.deadline - time.monotonic()
        ), "lease not lost before the deadline"
        assert time.monotonic() < session.deadline - 2.0
        assert lease.lost_reason == "session-lost"
        assert session.lost_reason == "revoked"
        assert client.get(resource) is None


def test_a_session_whose_heartbeat_stops_loses_its_leases_by_the_deadline(proxy: str, resource: str) -> None:
    with Client(proxy) as client:
        client._renewals_paused.set()  # the heartbeat of a paused process
        session = client.session(holder="paused", ttl=2)
        lease = session.lease(resource)
        results = {}

        def usurp() -> None:
            _, grant = take_over(proxy, resource, "usurper", 5, within=20)
            results["flag_set_at_takeover"] = threading.Event.is_set(lease.lost)
            results["token"] = int(grant["token"])

        usurper = threading.Thread(target=usurp)
        usurper.start()
        assert lease.lost.wait(
            timeout=session.deadline - time.monotonic() + SLACK
        ), "lease not lost by the deadline"
        assert time.monotonic() <= session.deadline + SLACK
        assert lease.lost_reason == "session-lost" and session.lost_reason == "expired"
        usurper.join()
        assert results["flag_set_at_takeover"] is True
        assert lease.token < results["token"]
        client._renewals_paused.clear()
        session.close()  # idempotent for the proxy: the session has ended
