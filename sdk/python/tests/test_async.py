"""The asyncio client: the same guarantees as the sync one."""

from __future__ import annotations

import asyncio
import gc
import time

import pytest

from conftest import Etcd, Upstream, take_over
from lease_proxy_client import AsyncClient, Held, Lost

SLACK = 0.5


@pytest.mark.asyncio
async def test_async_lease_renews_and_is_released_on_exit(proxy: str, resource: str) -> None:
    async with AsyncClient(proxy) as client:
        with pytest.raises(RuntimeError):
            async with client.lease(resource, ttl=2, holder="async") as lease:
                await asyncio.sleep(3.0)
                assert not lease.lost.is_set()
                with pytest.raises(Held):
                    await client.acquire(resource, ttl=2, holder="other")
                holding = await client.get(resource)
                assert holding is not None and holding.token == lease.token
                raise RuntimeError("the work failed")
        assert await client.get(resource) is None
        assert lease.lost_reason == "released"


@pytest.mark.asyncio
async def test_async_lease_dropped_without_release_ends_at_its_ttl(proxy: str, resource: str) -> None:
    async with AsyncClient(proxy) as client:
        lease = await client.acquire(resource, ttl=2, holder="forgetful")
        deadline = lease.deadline
        del lease
        gc.collect()
        await asyncio.sleep(max(deadline - time.monotonic(), 0) + 1.5)
        assert await client.get(resource) is None


@pytest.mark.asyncio
async def test_async_lost_fires_by_the_deadline_when_renewals_stop(proxy: str, resource: str) -> None:
    async with AsyncClient(proxy) as client:
        client._renewals_paused.set()
        lease = await client.acquire(resource, ttl=2, holder="paused")
        deadline = lease.deadline
        usurper = asyncio.get_running_loop().run_in_executor(
            None, take_over, proxy, resource, "usurper", 5, 20.0
        )
        await asyncio.wait_for(lease.lost.wait(), timeout=deadline - time.monotonic() + SLACK)
        assert time.monotonic() <= deadline + SLACK
        assert lease.lost_reason == "expired"
        _, grant = await usurper
        assert lease.token < int(grant["token"])
        with pytest.raises(Lost):
            await lease.forward("PUT", "anything", content=b"zombie write")
        await lease.release()


@pytest.mark.asyncio
async def test_async_a_process_resumed_past_its_deadline_sees_lost_before_acting(
    proxy: str, resource: str
) -> None:
    async with AsyncClient(proxy) as client:
        lease = await client.acquire(resource, ttl=2, holder="frozen")
        # the whole event loop frozen past the deadline (like SIGSTOP): no timer, no renewal ran
        time.sleep(max(lease.deadline - time.monotonic(), 0) + 0.2)
        assert lease.lost.is_set(), "a frozen holder resumed past its deadline must see lost first"
        assert lease.lost_reason == "expired"
        with pytest.raises(Lost):
            await lease.forward("PUT", "anything", content=b"zombie write")
        await lease.release()


@pytest.mark.asyncio
async def test_async_deadline_counts_from_before_the_request_was_sent(
    proxy: str, relay, resource: str
) -> None:
    slow = relay(delay=1.5)
    async with AsyncClient(slow.url) as client:
        client._renewals_paused.set()
        before = time.monotonic()
        lease = await client.acquire(resource, ttl=2, holder="slow-link")
        assert lease.deadline < before + lease.grant.expires_in_ms / 1000.0 + 0.5
        await asyncio.get_running_loop().run_in_executor(None, take_over, proxy, resource, "usurper", 5, 20.0)
        assert lease.lost.is_set(), "another holder got the resource while this one still held it"


@pytest.mark.asyncio
async def test_async_lost_fires_when_etcd_loses_the_lease(proxy: str, etcd: Etcd, resource: str) -> None:
    # The renewal's 410, not the loss watch (test_losses.py), tells here.
    async with AsyncClient(proxy, loss_watch=False) as client, client.lease(
        resource, ttl=6, holder="revoked"
    ) as lease:
        etcd.revoke(lease.lease_id)
        await asyncio.wait_for(lease.lost.wait(), timeout=lease.deadline - time.monotonic())
        assert time.monotonic() < lease.deadline - 2.0
        assert lease.lost_reason == "revoked"


@pytest.mark.asyncio
async def test_async_session_loss_reaches_its_leases(proxy: str, etcd: Etcd, resource: str) -> None:
    # The keepalive's 410, not the loss watch (test_losses.py), tells here.
    async with AsyncClient(proxy, loss_watch=False) as client, client.session(holder="s", ttl=6) as session:
        async with session.lease(resource) as lease:
            assert lease.session_id == session.id
            etcd.revoke(session.id)
            await asyncio.wait_for(lease.lost.wait(), timeout=session.deadline - time.monotonic())
            assert time.monotonic() < session.deadline - 2.0
            assert lease.lost_reason == "session-lost"
            assert session.lost_reason == "revoked"


@pytest.mark.asyncio
async def test_async_session_close_releases_its_leases(proxy: str, resource: str) -> None:
    async with AsyncClient(proxy) as client:
        async with client.session(holder="s", ttl=2) as session:
            lease = await session.acquire(resource)
            await asyncio.sleep(2.5)
            assert not lease.lost.is_set()
        assert lease.lost_reason == "released"
        assert await client.get(resource) is None


@pytest.mark.asyncio
async def test_async_forward_and_one_shots(proxy: str, upstream: Upstream, resource: str) -> None:
    async with AsyncClient(proxy) as client:
        async with client.lease(resource, ttl=10, holder="w") as lease:
            response = await lease.forward("POST", f"notes/{resource}", content=b"hello")
            assert response.status_code == 200
            listed = await client.list(prefix=resource)
            assert [h.resource for h in listed] == [resource]
        seen = [r for r in upstream.requests if r.path == f"/notes/{resource}"]
        assert len(seen) == 1 and seen[0].headers["fencing-token"] == lease.fencing_token
        grant = await client.grant(resource, ttl=10, holder="g")
        assert (await client.renew(resource, grant.secret)).token == grant.token
        await client.release(resource, grant.secret)
        with pytest.raises(Lost):
            await client.renew(resource, grant.secret)


@pytest.mark.asyncio
async def test_async_the_stop_by_deadline_keeps_the_safety_margin(proxy: str, resource: str) -> None:
    async with AsyncClient(proxy, safety_margin=1.0) as client:
        before = time.monotonic()
        lease = await client.acquire(resource, ttl=3, holder="margin")
        after = time.monotonic()
        life = min(lease.grant.expires_in_ms / 1000.0, 3.0)
        assert before + life - 1.0 - 1e-6 <= lease.deadline <= after + life - 1.0 + 1e-6
        await lease.release()
