"""Fleet members of the sync client (what each view means is decided in ``fleet_book.py``, free
of I/O and threads, for an asyncio twin too): :class:`Member` joins a fleet — a session kept
alive — and a thread long-polls its assignment, turning each change into an
:class:`AssignmentChange` whose granted resources are :class:`~lease_proxy_client.Lease` guards, lost with
``handed-off`` when the service moves them to another member."""

from __future__ import annotations

import queue
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, List, Optional, Tuple

from . import protocol
from .errors import LeaseProxyError, SessionLost
from .fleet_book import EVICTED, Book, HeldGrant, MemberView, releasing_deadline
from .models import Grant, SessionGrant
from .protocol import HANDED_OFF, RELEASED, REVOKED

if TYPE_CHECKING:
    from .client import Client, Lease, Session

#: Seconds one long poll of the assignment waits for a change unless told otherwise.
DEFAULT_POLL = 20.0

class Grip:
    """What a fleet grant's guard and its hand-off share: the grant is given back once for both,
    and only while the member still holds it — a session's secret proves every grant under the
    session, so a release sent for a grant that already ended could end a later grant of the same
    resource to this member."""

    def __init__(self, core: "Core", resource: str, token: int, secret: str, liveness: Any) -> None:
        self.resource = resource
        self.token = token
        self.secret = secret
        self.liveness = liveness
        self.released = False
        self.lease: Optional["weakref.ref[Any]"] = None
        self._core = weakref.ref(core)

    def claim(self) -> bool:
        """True (once) when the release should be sent now."""
        core = self._core()
        if core is None:
            return False
        with core.lock:
            if self.released:
                return False
            self.released = True
            return core.grips.get(self.resource) is self

    def unguarded(self) -> bool:
        """Whether its guard was dropped (garbage-collected)."""
        return self.lease is not None and self.lease() is None


@dataclass
class AssignmentChange:
    """One change of a member's assignment."""

    #: The assignment's revision: it rises with every change.
    revision: int
    #: ``active``, ``draining`` or ``evicted``.
    state: str
    #: Every resource held and assigned now, in name order.
    held: List[str]
    #: Newly granted: a lease guard each (lost when it leaves ``held``, the session ends, or the
    #: client's event stream tells its grant ended; :meth:`release` gives it back at once).
    added: List[Lease] = field(default_factory=list)
    #: Moved to another member: each guard was lost (``handed-off``); finish and release each by
    #: its deadline, or the service revokes it then.
    releasing: List[Releasing] = field(default_factory=list)
    #: Lost without a hand-off (revoked, the member evicted): their guards were lost (``revoked``).
    removed: List[str] = field(default_factory=list)
    #: The first change under a new session after the old one ended (``rejoin=True``): every
    #: guard of the old one was lost (``session-lost``).
    rejoined: bool = False


class Core:
    """The member's bookkeeping shared by the sync and asyncio members (no I/O): the session, the
    book, the grip of each grant handed out."""

    def __init__(self, fleet: str, member: str, session: Any) -> None:
        self.fleet = fleet
        self.member = member
        self.session: Optional[Any] = session
        self.lock = threading.Lock()
        self.book = Book()
        self.grips: Dict[str, Grip] = {}
        self.state: Optional[str] = None
        self.held: List[str] = []

    def apply(
        self,
        view: MemberView,
        received: float,
        rejoined: bool,
        guard: Callable[[Any, Grant, Grip], "Lease"],
        releasing: Callable[[Grip, float], "Releasing"],
    ) -> Tuple[AssignmentChange, List[Grip]]:
        """Takes in ``view``: the change, and the grips to release now (moved away with nobody
        guarding them). ``guard`` makes a lease guard, ``releasing`` a hand-off entry."""
        with self.lock:
            plan = self.book.apply(view)
            self.state, self.held = view.state, list(plan.held)
            change = AssignmentChange(view.revision, view.state, list(plan.held))
            change.rejoined = rejoined
            release: List[Grip] = []
            for resource, token in plan.removed:
                grip = self.grips.pop(resource, None)
                if grip is not None and grip.token == token:
                    grip.liveness.fire(REVOKED)
                change.removed.append(resource)
            for moved in plan.handed_off:
                grip = self.grips.get(moved.resource)
                if grip is None:
                    continue
                grip.liveness.fire(HANDED_OFF)
                change.releasing.append(releasing(grip, releasing_deadline(received, moved.deadline_ms)))
                if grip.unguarded():
                    release.append(grip)
            session = self.session
            if session is not None:
                for resource in plan.release_now:
                    release.append(Grip(self, resource, 0, session.secret, None))
                for h in plan.added:
                    grant = _grant(h, self.member, session)
                    grip = Grip(self, h.resource, h.token, session.secret, None)
                    lease = guard(session, grant, grip)
                    grip.liveness = lease._liveness  # type: ignore[attr-defined]
                    grip.lease = weakref.ref(lease)
                    self.grips[h.resource] = grip
                    change.added.append(lease)
            self.grips = {r: g for r, g in self.grips.items() if self.book.holds(r, g.token)}
        for grip in release:
            if grip.token == 0:
                grip.released = True  # never handed out: nothing to check against
        return change, release

    def renewed(self, session: Any) -> bool:
        """Installs a new session (a rejoin); False when the member left meanwhile."""
        with self.lock:
            if self.session is None:
                return False
            self.session = session
            self.book.clear()
            self.grips.clear()
            return True


def _grant(h: HeldGrant, member: str, session: Any) -> Grant:
    """The grant of a held fleet resource: it lives on the member's session, proven by its secret."""
    return Grant(
        resource=h.resource,
        holder=member,
        lease_id=h.lease_id,
        secret=session.secret,
        token=h.token,
        fencing_token=h.fencing_token,
        ttl_seconds=session.ttl_seconds,
        expires_in_ms=0,
        session=session.id,
    )


def joined_session(body: Dict[str, Any], member: str) -> SessionGrant:
    """The session of a join's 201 answer (it names no holder: the member is)."""
    return SessionGrant.from_json({**body, "holder": member})


class Releasing:
    """A resource moved away from the member: finish with it by :attr:`deadline` (on
    :func:`time.monotonic`'s clock: the answer's arrival plus the service's ``deadline_ms``, less
    a tenth of it, at least 0.1 s), then :meth:`release` it."""

    def __init__(self, client: "Client", grip: Grip, deadline: float) -> None:
        self._client = client
        self._grip = grip
        self._deadline = deadline

    @property
    def resource(self) -> str:
        return self._grip.resource

    @property
    def token(self) -> int:
        """The token of the grant handed off."""
        return self._grip.token

    @property
    def deadline(self) -> float:
        """When to have released it by, on :func:`time.monotonic`'s clock."""
        return self._deadline

    def release(self) -> None:
        """Releases the grant (once for it and its guard together; nothing is sent once the
        member no longer holds it)."""
        if self._grip.claim():
            self._client.release(self._grip.resource, self._grip.secret)

    def __repr__(self) -> str:
        return f"<Releasing {self.resource} token={self.token}>"


_END = object()


class Member:
    """This process in a fleet (:meth:`Client.join_fleet <lease_proxy_client.Client.join_fleet>`):
    a session kept alive in the background and a thread following its assignment. Use it as a
    context manager (it leaves on exit) or call :meth:`leave`."""

    def __init__(
        self, client: "Client", fleet: str, member: str, session: "Session", join: Callable[[], "Session"],
        poll: float, rejoin: bool,
    ) -> None:  # fmt: skip
        self._client = client
        self._core = Core(fleet, member, session)
        self._join = join
        self._poll = poll
        self._rejoin = rejoin
        self._changes: "queue.Queue[Any]" = queue.Queue()
        self._stop = threading.Event()
        #: Set once the member has ended (left, evicted, or failed: see :meth:`assignments`).
        self.ended = threading.Event()
        threading.Thread(target=self._follow, name=f"fleet {fleet}/{member}", daemon=True).start()

    @property
    def fleet(self) -> str:
        return self._core.fleet

    @property
    def name(self) -> str:
        return self._core.member

    @property
    def session(self) -> Optional[Session]:
        """The member's session now (None once left); a rejoin replaces it."""
        return self._core.session

    @property
    def state(self) -> Optional[str]:
        """Where it stands as last read (None before the first read)."""
        return self._core.state

    @property
    def held(self) -> List[str]:
        """What it holds and is assigned as last read."""
        return list(self._core.held)

    def assignments(self) -> Iterator[AssignmentChange]:
        """The changes of its assignment, from the first read on (each yielded once, whoever asks).
        Ends once the member has ended: after an eviction (the last change says so) or a leave;
        or raises why it ended — :class:`~lease_proxy_client.SessionLost` or the 404 ``no-member``
        :class:`~lease_proxy_client.Problem` (its session ended, without ``rejoin``), 404
        ``no-fleet``, 403 ``not-member``."""
        while True:
            item = self._changes.get()
            if item is _END:
                self._changes.put(_END)  # for any other reader
                return
            if isinstance(item, BaseException):
                self._changes.put(_END)
                raise item
            yield item

    def serve(self, work: Callable[["Lease"], None]) -> None:
        """Runs ``work(lease)`` for each resource granted, in a thread of its own; it should stop
        when ``lease.lost`` is set (handed off, revoked, session lost). The resource is given back
        when ``work`` returns. Returns once the member has ended and every ``work`` has returned
        (raising why it ended, as :meth:`assignments`)."""
        threads: List[threading.Thread] = []

        def run(lease: "Lease") -> None:
            try:
                work(lease)
            finally:
                try:
                    lease.release()
                except LeaseProxyError:
                    pass

        try:
            for change in self.assignments():
                for lease in change.added:
                    t = threading.Thread(target=run, args=(lease,), name=f"fleet work {lease.resource}")
                    t.start()
                    threads.append(t)
        finally:
            for t in threads:
                t.join()

    def drain(self) -> str:
        """Asks the service to hand off everything the member holds and give it nothing new; its
        assignment then shows each hand-off. Its state after the call."""
        session = self._core.session
        if session is None:
            raise SessionLost(f"{self.name} has left {self.fleet}")
        sent, answer = self._client._timed(protocol.drain_call(self.fleet, self.name, session.secret))
        return str(protocol.parse(answer, lambda b: b["state"]))

    def leave(self) -> None:
        """Stops following the assignment and closes the session, which ends every grant under it
        (their guards are lost, ``released``/``session-lost``)."""
        self._stop.set()
        with self._core.lock:
            session, self._core.session = self._core.session, None
        self.ended.set()
        if session is not None:
            session.close()

    def __enter__(self) -> "Member":
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.leave()
        except LeaseProxyError:
            if exc[0] is None:
                raise

    def __repr__(self) -> str:
        return f"<Member {self.name} of {self.fleet} state={self.state}>"

    # --- the thread ---

    def _read(self, after: Optional[int], secret: str) -> Tuple[MemberView, float]:
        call = protocol.member_view_call(self.fleet, self.name, secret, after, self._poll)
        _, answer = self._client._timed(call)
        return protocol.parse(answer, MemberView.from_json), time.monotonic()

    def _follow(self) -> None:
        after: Optional[int] = None
        attempt = 0
        rejoined = False
        failure: Optional[BaseException] = None
        while not self._stop.is_set():
            session = self._core.session
            if session is None:
                break
            try:
                if session.lost.is_set() and session.lost_reason != RELEASED:
                    raise SessionLost(f"session {session.id}: {session.lost_reason}")
                view, received = self._read(after, session.secret)
            except LeaseProxyError as e:
                if self._stop.is_set():
                    break
                if protocol.is_no_member(e):
                    session._liveness.fire(REVOKED)
                    if self._rejoin:
                        try:
                            if not self._core.renewed(self._join()):
                                break
                            after, rejoined = None, True
                            continue
                        except LeaseProxyError as again:
                            if protocol.is_transient(again) or isinstance(again, protocol.TransportError):
                                time.sleep(protocol.retry_backoff(min(attempt, 4)))
                                attempt += 1
                                continue
                            e = again
                    failure = e
                    break
                if protocol.is_transient(e) or isinstance(e, protocol.TransportError):
                    self._stop.wait(protocol.retry_backoff(min(attempt, 4)) * 2)
                    attempt += 1
                    continue
                failure = e
                break
            attempt = 0
            if after is not None and view.revision <= after:
                continue  # the wait ended without a change
            after = view.revision
            change, release = self._core.apply(
                view, received, rejoined, self._client._fleet_lease, lambda g, d: Releasing(self._client, g, d)
            )
            rejoined = False
            self._changes.put(change)
            for grip in release:
                self._give_back(grip)
            if view.state == EVICTED:
                break
        self._end(failure)

    def _give_back(self, grip: Grip) -> None:
        if grip.released and grip.token != 0:
            return
        if grip.token == 0 or grip.claim():
            try:
                self._client.release(grip.resource, grip.secret)
            except LeaseProxyError:
                pass  # the service revokes it at its deadline

    def _end(self, failure: Optional[BaseException]) -> None:
        # Ended before the reader learns why: whoever sees the end sees `ended` set.
        with self._core.lock:
            session, self._core.session = self._core.session, None
        self.ended.set()
        if failure is not None:
            self._changes.put(failure)
        self._changes.put(_END)
        if session is not None and not self._stop.is_set():
            try:
                session.close()
            except LeaseProxyError:
                pass
