#!/usr/bin/env python3
"""The scripted scenario every SDK runs (docs/SDKS.md), with this SDK, against a running stack —
lease-proxy, the warehouse inventory behind fence-gateway, etcd —: prints what the SDK let it
observe, one line per step: KEY, a tab, the observation. scripts/sdk-scenario.sh runs it beside
the other SDKs' runners and compares the lines.

    python3 scenario.py --proxy URL --gateway URL --etcd URL --prefix NAME-
"""

from __future__ import annotations

import argparse
import queue
import sys
import threading
import time
from typing import Callable, List, Optional

import httpx

from lease_proxy_client import Client, FencingAuth, Lease, LeaseProxyError, Lost, Member, Problem, SessionLost

#: Each wait of the scenario is bounded by this (seconds).
WITHIN = 5.0
#: The fleet's drain deadline (seconds): a hand-off done in a quarter of it was the member's release.
DRAIN = 20


def say(key: str, observed: str) -> None:
    print(f"{key}\t{observed}", flush=True)


def eventually(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WITHIN
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not within {WITHIN} s")
        time.sleep(0.02)


def compare(a: int, b: int) -> str:
    return "above" if a > b else "equal to" if a == b else "below"


class Scenario:
    def __init__(self, proxy: str, gateway: str, etcd: str, prefix: str) -> None:
        self.proxy, self.etcd, self.prefix = proxy, etcd, prefix
        self.store = httpx.Client(base_url=gateway, timeout=10)

    def outcome(self, lease: Lease, send: Callable[[], httpx.Response]) -> str:
        """The outcome of a write under ``lease``: its status (and the gateway's refusal), or the
        SDK's refusal to send."""
        try:
            response = send()
        except Lost:
            return f"refused by the SDK, nothing sent: lost ({lease.lost_reason})"
        except (httpx.HTTPError, LeaseProxyError) as e:
            return f"error: {e}"
        rejection = response.headers.get("fencing-rejection")
        return f"{response.status_code} {rejection}" if rejection else str(response.status_code)

    def write(self, lease: Lease, robot: str, n: int) -> str:
        """A count written through fence-gateway with ``FencingAuth``, which adds the lease's token."""
        body = {"robot": robot, "count": n}
        return self.outcome(
            lease, lambda: self.store.put(f"/aisles/{lease.resource}/count", json=body, auth=FencingAuth(lease))
        )

    def presented(self, lease: Lease, robot: str, n: int) -> str:
        """A count written with ``lease``'s token set by hand, as a holder that missed its loss would."""
        headers = {"fencing-token": lease.fencing_token, "fencing-resource": lease.resource}
        body = {"robot": robot, "count": n}
        sent = self.outcome(lease, lambda: self.store.put(f"/aisles/{lease.resource}/count", json=body, headers=headers))
        return f"token sent anyway: {sent}"

    def revoke(self, lease_id: str) -> None:
        """Revokes an etcd lease through etcd's JSON gateway: a lease lost to etcd."""
        response = httpx.post(f"{self.etcd}/v3/lease/revoke", json={"ID": lease_id}, timeout=10)
        if response.status_code != 200:
            raise RuntimeError(f"revoke {lease_id}: {response.status_code}")

    def leases(self) -> None:
        """Acquire, renew, write through the gateway, a takeover after a forced loss, the old
        holder's write refused, release."""
        with Client(self.proxy) as a, Client(self.proxy) as b:
            aisle = f"{self.prefix}aisle"
            old = a.acquire(aisle, ttl=3, holder="a")
            say("lease.acquire", f"acquired by {old.holder}")
            first = old.deadline
            eventually(lambda: old.deadline > first, "a renewal moving the stop-by deadline on")
            held = f"lost ({old.lost_reason})" if old.lost.is_set() else "held"
            say("lease.renew", f"renewed in the background: stop-by later, {held}")
            say("lease.write", self.write(old, "a", 1))
            self.revoke(old.lease_id)
            if not old.lost.wait(WITHIN):
                raise RuntimeError("the revoked lease was not reported lost")
            say("lease.revoke", f"a told: lost ({old.lost_reason})")
            newer = b.acquire(aisle, ttl=3, holder="b", wait=WITHIN)
            say("lease.takeover", f"acquired by {newer.holder}, token {compare(newer.token, old.token)} a's")
            say("lease.new-write", self.write(newer, "b", 2))
            say("lease.old-write", self.write(old, "a", 3))
            say("lease.old-token", self.presented(old, "a", 4))
            newer.release()
            free = "the resource is free" if b.get(aisle) is None else "the resource is not free"
            say("lease.release", f"released by {newer.holder}: {free}")

    def fleet(self) -> None:
        """A member receives, writes and hands off when a second one joins, drains; a member
        whose session ends is told."""
        with Client(self.proxy) as client:
            name = f"{self.prefix}fleet"
            client.put_fleet(name, [f"{name}-1", f"{name}-2"], drain=DRAIN)
            m1 = client.join_fleet(name, member="m1", ttl=10, poll=2)
            w1 = Serving(m1)
            got = w1.started.take(2)
            say("fleet.join", f"m1 assigned {len(got)} resources")
            say("fleet.write", f"{self.write(got[0], 'm1', 1)}; {self.write(got[1], 'm1', 1)}")

            m2 = client.join_fleet(name, member="m2", ttl=10, poll=2)
            joined = time.monotonic()
            w2 = Serving(m2)
            (moved,) = w1.ended.take(1)
            say("fleet.second-join", f"m1's work on 1 resource ended: {moved.lost_reason}")
            (taken,) = w2.started.take(1)
            took = time.monotonic() - joined
            if taken.resource != moved.resource:
                when = "but another resource"
            elif took < DRAIN / 4:
                when = "well within the drain deadline"
            else:
                when = f"after {took * 1000:.0f} ms (the service's revocation, not the member's release)"
            say("fleet.hand-off", f"m2 assigned the same resource, token {compare(taken.token, moved.token)} m1's, {when}")
            say("fleet.new-write", self.write(taken, "m2", 2))
            say("fleet.old-write", self.write(moved, "m1", 3))
            say("fleet.old-token", self.presented(moved, "m1", 4))

            m1.drain()
            (drained,) = w1.ended.take(1)
            (rest,) = w2.started.take(1)
            same = "true" if rest.resource == drained.resource else "false"
            say("fleet.drain", f"m1's work on 1 resource ended: {drained.lost_reason}; m2 assigned it: {same}")

            session = m2.session
            assert session is not None
            self.revoke(session.id)
            ended = w2.ended.take(2)
            lost = sum(lease.lost.is_set() for lease in ended)
            w2.thread.join(WITHIN)
            if w2.thread.is_alive():
                raise RuntimeError("m2's serve did not end after its session ended")
            why = w2.why
            ended_as = (
                "session lost"
                if isinstance(why, SessionLost) or (isinstance(why, Problem) and why.slug == "no-member")
                else repr(why)
            )
            say("fleet.session-end", f"m2's work on {lost} resources ended: lost; the member ended: {ended_as}")
            m1.leave()
            w1.thread.join(WITHIN)
            client.delete_fleet(name)


class Mailbox:
    """The leases a member's work starts or ends with, in order."""

    def __init__(self) -> None:
        self._items: "queue.Queue[Lease]" = queue.Queue()

    def put(self, lease: Lease) -> None:
        self._items.put(lease)

    def take(self, n: int) -> List[Lease]:
        """The next ``n`` within the scenario's bound, sorted by resource."""
        deadline = time.monotonic() + WITHIN
        got = []
        for _ in range(n):
            try:
                got.append(self._items.get(timeout=max(deadline - time.monotonic(), 0.01)))
            except queue.Empty:
                raise RuntimeError(f"{n} leases: not within {WITHIN} s") from None
        return sorted(got, key=lambda lease: lease.resource)


class Serving:
    """``member.serve`` in a thread, with work that reports its start and end and waits for its
    lease's loss."""

    def __init__(self, member: Member) -> None:
        self.started, self.ended = Mailbox(), Mailbox()
        self.why: Optional[BaseException] = None
        self.thread = threading.Thread(target=self._serve, args=(member,), daemon=True)
        self.thread.start()

    def _work(self, lease: Lease) -> None:
        self.started.put(lease)
        lease.lost.wait()
        self.ended.put(lease)

    def _serve(self, member: Member) -> None:
        try:
            member.serve(self._work)
        except LeaseProxyError as e:
            self.why = e


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--proxy", required=True)
    p.add_argument("--gateway", required=True)
    p.add_argument("--etcd", required=True)
    p.add_argument("--prefix", default="py-")
    args = p.parse_args(argv)
    scenario = Scenario(args.proxy, args.gateway, args.etcd, args.prefix)
    try:
        scenario.leases()
        scenario.fleet()
    except (LeaseProxyError, RuntimeError, AssertionError, httpx.HTTPError) as e:
        say("failed", f"{type(e).__name__}: {e}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
