"""What the loss watch knows, without I/O (shared by the sync and asyncio clients): the grants a
client's guards hold, what an ownership event means for each of them (:func:`loss`), and what the
watch's one stream must cover (:meth:`Book.wanted`). The streams are ``loss_watch.py``'s.

An event is matched to a grant by resource **and** token (the grant's create revision): an end
(``released``, ``expired``) ends the grant whose token it carries and no other, so an event of an
older grant of the same resource never ends a newer one; an ``acquired`` with a larger token
means a later grant exists, so ours has ended whatever told us so (taken over)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Deque, Dict, Generic, List, Optional, Protocol, Tuple, TypeVar

from .protocol import REVOKED

T = TypeVar("T")

#: How many recent events are kept for a grant registered after its own end was read.
RECENT = 1024

#: How a held grant ended, as an event tells it.
RELEASED = "released"
EXPIRED = "expired"
TAKEN_OVER = "taken-over"


def loss(kind: str, event: int, held: int) -> Optional[str]:
    """What an event of ``kind`` for the grant with token ``event`` means for the held grant of
    the same resource with token ``held``: :data:`RELEASED`, :data:`EXPIRED`,
    :data:`TAKEN_OVER`, or None."""
    if kind == "released" and event == held:
        return RELEASED
    if kind == "expired" and event == held:
        return EXPIRED
    if kind == "acquired" and event > held:
        return TAKEN_OVER
    return None


def revision(event_id: str) -> int:
    """The revision of an event id (``R`` or ``R.n``); 0 for anything else (covers nothing)."""
    head = event_id.split(".", 1)[0]
    return int(head) if head.isdigit() else 0


def earliest(last: Optional[str], token: Optional[int]) -> Optional[str]:
    """The earlier resume point of the event id ``last`` and the bare revision ``token``."""
    if last is not None and (token is None or token >= revision(last)):
        return last
    return None if token is None else str(token)


@dataclass
class Coverage:
    """Where the stream stands: its prefix, and the revision it reads after (None: opened "from
    now", its start not known)."""

    prefix: str
    after: Optional[int]


class Book(Generic[T]):
    """The held grants (each with the ``T`` to tell when it is lost) and recent events. Not
    thread-safe: its owner locks."""

    def __init__(self) -> None:
        self._held: Dict[str, List[Tuple[int, int, T]]] = {}
        self._next_id = 0
        self._recent: Deque[Tuple[str, str, int]] = deque(maxlen=RECENT)
        #: What the running stream covers; None when none runs.
        self.coverage: Optional[Coverage] = None
        #: The smallest token of the registered grants the stream does not cover: it must be
        #: reopened to read from there (taken when it is).
        self.uncovered: Optional[int] = None

    def register(self, resource: str, token: int, target: T) -> Tuple[int, Optional[str]]:
        """Registers the grant of ``resource`` with ``token``: its id (to deregister it), and its
        loss if an event already read ended it."""
        grant_id = self._next_id
        self._next_id += 1
        for r, kind, t in self._recent:
            ended = loss(kind, t, token) if r == resource else None
            if ended is not None:
                return grant_id, ended
        self._held.setdefault(resource, []).append((grant_id, token, target))
        c = self.coverage
        covered = c is not None and resource.startswith(c.prefix) and c.after is not None and c.after <= token
        if not covered:
            self.uncovered = token if self.uncovered is None else min(self.uncovered, token)
        return grant_id, None

    def deregister(self, grant_id: int) -> None:
        """Forgets grant ``grant_id`` (released, or its guard dropped)."""
        for resource in list(self._held):
            kept = [g for g in self._held[resource] if g[0] != grant_id]
            if kept:
                self._held[resource] = kept
            else:
                del self._held[resource]

    def is_empty(self) -> bool:
        """Whether no grant is held."""
        return not self._held

    def see(self, resource: str, kind: str, token: int) -> List[Tuple[T, str]]:
        """Takes in an event: the held grants it ends (forgotten from here on) and how."""
        self._recent.append((resource, kind, token))
        lost: List[Tuple[T, str]] = []
        kept: List[Tuple[int, int, T]] = []
        for grant in self._held.get(resource, []):
            how = loss(kind, token, grant[1])
            if how is None:
                kept.append(grant)
            else:
                lost.append((grant[2], how))
        if kept:
            self._held[resource] = kept
        else:
            self._held.pop(resource, None)
        return lost

    def wanted(self) -> Optional[Tuple[str, int]]:
        """What the stream must cover: the longest prefix every held resource starts with, and the
        smallest held token. None when nothing is held."""
        if not self._held:
            return None
        names = list(self._held)
        prefix = names[0]
        for name in names[1:]:
            n = 0
            while n < min(len(prefix), len(name)) and prefix[n] == name[n]:
                n += 1
            prefix = prefix[:n]
        return prefix, min(g[1] for grants in self._held.values() for g in grants)


class _Fires(Protocol):
    _parent: Any

    def check(self) -> None: ...

    def fire(self, reason: str) -> bool: ...


def tell(liveness: _Fires, how: str) -> None:
    """An event ended the grant of ``liveness``'s guard: it is lost (``revoked``); an expiry of a
    grant under a session means the session's lease ended, so the session is lost (its leases
    with it, ``session-lost``). A guard already past its deadline (a process paused, the event
    read on resuming) was lost first by that: ``expired``."""
    liveness.check()
    if how == EXPIRED and liveness._parent is not None:
        liveness._parent.fire(REVOKED)
    else:
        liveness.fire(REVOKED)
