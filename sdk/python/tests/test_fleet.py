"""Fleet members (sync) against the real proxy: a member receives its share as lease guards and
writes through the proxy's forward with their tokens; a second member joins and the first hands
half off (guards lost ``handed-off``, released by the member, granted to the second with larger
tokens); drain and eviction; a session revoked in etcd is told (or rejoined); ``serve`` runs work
per resource; the operator's calls; and the book's decisions without a proxy. Fleets use ``drain_ms`` of 30 s, so only the member's own
release moves a resource within the test's waits; nothing waits for a TTL."""

from __future__ import annotations

import queue
import threading
import time
from typing import Any, Callable, List, Tuple

import pytest

from conftest import Etcd, Upstream
from lease_proxy_client import AssignmentChange, Client, Lease, Member, Problem, SessionLost
from lease_proxy_client.fleet_book import Book, HeldGrant, MemberView, ReleasingEntry, releasing_deadline

WITHIN = 10.0
DRAIN = 30.0


def feed(member: Member) -> "queue.Queue[Any]":
    """The member's changes, read by a thread into a queue (an error ends it, put as an item)."""
    changes: "queue.Queue[Any]" = queue.Queue()

    def read() -> None:
        try:
            for change in member.assignments():
                changes.put(change)
        except BaseException as e:  # noqa: BLE001 - handed to the test
            changes.put(e)
        changes.put(None)

    threading.Thread(target=read, daemon=True).start()
    return changes


def until(
    changes: "queue.Queue[Any]", done: Callable[[AssignmentChange[Lease]], bool]
) -> Tuple[AssignmentChange[Lease], List[Lease], List[Any]]:
    """Changes until ``done``; the last, with every guard added and hand-off seen meanwhile."""
    added: List[Lease] = []
    releasing: List[Any] = []
    deadline = time.monotonic() + WITHIN
    while True:
        item = changes.get(timeout=max(deadline - time.monotonic(), 0.01))
        assert isinstance(item, AssignmentChange), f"the assignments ended: {item!r}"
        added.extend(item.added)
        releasing.extend(item.releasing)
        if done(item):
            return item, added, releasing


def ended(changes: "queue.Queue[Any]") -> Any:
    """Reads past the changes still queued to how the assignments ended: None, or the error."""
    deadline = time.monotonic() + WITHIN
    while True:
        item = changes.get(timeout=max(deadline - time.monotonic(), 0.01))
        if not isinstance(item, AssignmentChange):
            return item


def held(n: int) -> Callable[[AssignmentChange[Lease]], bool]:
    return lambda change: len(change.held) == n


def make_fleet(client: Client, name: str, n: int = 4) -> List[str]:
    resources = [f"{name}-r{i}" for i in range(n)]
    written = client.put_fleet(name, resources, drain=DRAIN)
    assert written.resources == resources and written.drain_ms == int(DRAIN * 1000)
    return resources


def test_a_member_receives_writes_and_hands_off_half_to_a_second(
    proxy: str, upstream: Upstream, resource: str
) -> None:
    with Client(proxy) as client:
        assert client.get_fleet(resource) is None
        with pytest.raises(Problem) as raised:
            client.join_fleet(resource, member="robot-a", ttl=10)
        assert raised.value.status == 404 and raised.value.slug == "no-fleet"
        resources = make_fleet(client, resource)
        with client.join_fleet(resource, member="robot-a", ttl=10, poll=5) as a:
            a_changes = feed(a)
            _, a_leases, _ = until(a_changes, held(4))
            assert sorted(lease.resource for lease in a_leases) == resources
            for lease in a_leases:
                assert lease.session_id == a.session.id and not lease.lost.is_set()
                lease.forward("PUT", f"items/{lease.resource}", json={"by": "robot-a"})
                sent = upstream.requests[-1].headers
                assert sent["fencing-token"] == lease.fencing_token, sent
            tokens = {lease.resource: lease.token for lease in a_leases}

            with client.join_fleet(resource, member="robot-b", ttl=10, poll=5) as b:
                b_changes = feed(b)
                _, _, moved = until(a_changes, held(2))
                assert len(moved) == 2
                for entry in moved:
                    guard = next(lease for lease in a_leases if lease.resource == entry.resource)
                    assert guard.lost_reason == "handed-off"
                    assert entry.deadline > time.monotonic() + DRAIN / 2
                    entry.release()
                _, b_leases, _ = until(b_changes, held(2))
                assert sorted(lease.resource for lease in b_leases) == sorted(e.resource for e in moved)
                assert all(lease.token > tokens[lease.resource] for lease in b_leases)
                view = client.get_fleet(resource)
                assert view is not None and view.unassigned == []
                assert {m.member: len(m.held) for m in view.members} == {"robot-a": 2, "robot-b": 2}
            # b left: its session closed, its guards released; a gets everything back.
            assert all(lease.lost_reason == "released" for lease in b_leases)
            until(a_changes, held(4))
        assert a.session is None
        client.delete_fleet(resource)
        client.delete_fleet(resource)  # idempotent
        assert client.get_fleet(resource) is None


def test_drain_and_eviction_reach_the_member(proxy: str, resource: str) -> None:
    with Client(proxy) as client:
        make_fleet(client, resource, 2)
        a = client.join_fleet(resource, member="robot-a", ttl=10, poll=5)
        a_changes = feed(a)
        _, a_leases, _ = until(a_changes, held(2))
        b = client.join_fleet(resource, member="robot-b", ttl=10, poll=5)
        b_changes = feed(b)
        until(b_changes, lambda change: change.state == "active")
        # The member drains itself: everything is handed off, b takes it.
        assert a.drain() == "draining"
        last, _, moved = until(a_changes, held(0))
        assert last.state == "draining" and {e.resource for e in moved} == {lease.resource for lease in a_leases}
        for entry in moved:
            entry.release()
        _, b_leases, _ = until(b_changes, held(2))
        # An operator evicts b: its guards are lost at once, its assignments end.
        client.evict_member(resource, "robot-b")
        last, _, _ = until(b_changes, lambda change: change.state == "evicted")
        assert last.held == [] and sorted(last.removed) == sorted(lease.resource for lease in b_leases)
        assert all(lease.lost_reason == "revoked" for lease in b_leases)
        assert ended(b_changes) is None
        assert b.ended.is_set()
        # An operator's drain of a drained member.
        assert client.drain_member(resource, "robot-a") == "draining"
        a.leave()
        ended(a_changes)


def test_a_member_whose_session_ends_is_told_or_joins_again(proxy: str, etcd: Etcd, resource: str) -> None:
    with Client(proxy) as client:
        make_fleet(client, resource, 2)
        a = client.join_fleet(resource, member="robot-a", ttl=10, poll=5)
        a_changes = feed(a)
        _, a_leases, _ = until(a_changes, held(2))
        assert a.session is not None
        etcd.revoke(a.session.id)
        why = ended(a_changes)
        assert isinstance(why, (SessionLost, Problem)), why
        assert all(lease.lost_reason == "session-lost" for lease in a_leases)
        assert a.ended.is_set()

        b = client.join_fleet(resource, member="robot-b", ttl=10, poll=5, rejoin=True)
        b_changes = feed(b)
        _, b_leases, _ = until(b_changes, held(2))
        first = b.session
        assert first is not None
        etcd.revoke(first.id)
        rejoined, _, _ = until(b_changes, lambda change: change.rejoined)
        assert all(lease.lost_reason == "session-lost" for lease in b_leases)
        if len(rejoined.held) != 2:
            until(b_changes, held(2))
        assert b.session is not None and b.session.id != first.id
        b.leave()


def test_serve_runs_work_per_resource_until_its_guard_is_lost(proxy: str, resource: str) -> None:
    with Client(proxy) as client:
        resources = make_fleet(client, resource, 3)
        member = client.join_fleet(resource, member="robot-s", ttl=10, poll=5)
        started: "queue.Queue[str]" = queue.Queue()
        reasons: "queue.Queue[Tuple[str, Any]]" = queue.Queue()

        def work(lease: Lease) -> None:
            started.put(lease.resource)
            lease.lost.wait(WITHIN)
            reasons.put((lease.resource, lease.lost_reason))

        server = threading.Thread(target=member.serve, args=(work,), daemon=True)
        server.start()
        assert sorted(started.get(timeout=WITHIN) for _ in resources) == resources
        client.evict_member(resource, "robot-s")
        assert sorted(reasons.get(timeout=WITHIN) for _ in resources) == [(r, "revoked") for r in resources]
        server.join(WITHIN)
        assert not server.is_alive()



def view(state: str, held: List[Tuple[str, int]], releasing: Tuple[str, ...] = ()) -> MemberView:
    return MemberView(
        state=state,
        revision=1,
        held=tuple(HeldGrant(r, "7", t, f"ft-{r}-{t}") for r, t in held),
        releasing=tuple(ReleasingEntry(r, 3000) for r in releasing),
    )


def test_the_book_knows_a_grant_by_resource_and_token() -> None:
    book = Book()
    plan = book.apply(view("active", [("a", 1), ("b", 2), ("c", 3)]))
    assert [h.resource for h in plan.added] == ["a", "b", "c"] and plan.held == ["a", "b", "c"]
    # Same token: nothing; a new token: the old guard removed, a new one added; moved: handed
    # off; gone from both lists: removed; releasing without a guard: released at once.
    plan = book.apply(view("active", [("a", 1), ("b", 5)], ("c", "d")))
    assert [(h.resource, h.token) for h in plan.added] == [("b", 5)]
    assert plan.removed == [("b", 2)]
    assert [(m.resource, m.token) for m in plan.handed_off] == [("c", 3)]
    assert plan.release_now == ["d"] and plan.held == ["a", "b"]
    assert book.holds("c", 3) and not book.holds("b", 2)
    plan = book.apply(view("active", [("a", 1), ("b", 5)]))
    assert plan.removed == [] and plan.handed_off == [] and not book.holds("c", 3)
    # Evicted: nothing is held, whatever the view still lists.
    plan = book.apply(view("evicted", [("a", 1)], ("b",)))
    assert sorted(plan.removed) == [("a", 1), ("b", 5)] and plan.held == [] and plan.added == []
    assert releasing_deadline(100.0, 3000) == pytest.approx(102.7)
    assert releasing_deadline(100.0, 500) == pytest.approx(100.4)
    assert releasing_deadline(100.0, -5) == 100.0
