"""What a fleet member knows of its assignment, without I/O (shared by the sync and asyncio
members, and the same decision as the Rust SDK's ``fleet/book.rs``): the view the service
answers, read once (:class:`MemberView`), and what each new view means for the grants the member
has handed out (:meth:`Book.apply` → :class:`Plan`).

A grant is known by resource **and** token. One the view lists in ``held`` with the same token
stays; with another token it is a new grant (the old one ended). One that moves to ``releasing``
was handed off: its guard is lost (``handed-off``) and it must be released. One that leaves both
lists ended without a hand-off (revoked, the member evicted). A ``releasing`` entry the member
never handed out as a guard is released at once: nothing works on it. An evicted member holds
nothing, whatever its view still lists (its grants are being ended at once)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple

from .models import _int, _str

ACTIVE = "active"
DRAINING = "draining"
EVICTED = "evicted"
STATES = (ACTIVE, DRAINING, EVICTED)


@dataclass(frozen=True)
class HeldGrant:
    """One grant the member holds and is assigned."""

    resource: str
    #: The session it lives on (decimal).
    lease_id: str
    token: int
    fencing_token: str

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> "HeldGrant":
        return cls(
            resource=_str(body["resource"]),
            lease_id=_str(body["lease_id"]),
            token=_int(body["token"]),
            fencing_token=_str(body["fencing_token"]),
        )


@dataclass(frozen=True)
class ReleasingEntry:
    """One resource the member holds and must release."""

    resource: str
    #: Milliseconds left, on the proxy's clock when it answered, before the service revokes it.
    deadline_ms: int


@dataclass(frozen=True)
class MemberView:
    """``GET /v1/fleets/{fleet}/members/{member}``."""

    state: str
    revision: int
    held: Tuple[HeldGrant, ...]
    releasing: Tuple[ReleasingEntry, ...]

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> "MemberView":
        state = _str(body["state"])
        if state not in STATES:
            raise ValueError(f"unknown member state {state!r}")
        if not isinstance(body["revision"], str):
            raise TypeError("revision is not a decimal string")
        return cls(
            state=state,
            revision=_int(body["revision"]),
            held=tuple(HeldGrant.from_json(_object(h)) for h in _list(body["held"])),
            releasing=tuple(
                ReleasingEntry(_str(_object(r)["resource"]), _int(_object(r)["deadline_ms"]))
                for r in _list(body["releasing"])
            ),
        )


def _list(value: Any) -> List[Any]:
    if not isinstance(value, list):
        raise TypeError(f"not a list: {value!r}")
    return value


def _object(value: Any) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise TypeError(f"not an object: {value!r}")
    return value


@dataclass(frozen=True)
class HandedOff:
    """A grant handed off: lose its guard, release it by ``deadline_ms``."""

    resource: str
    token: int
    deadline_ms: int


@dataclass
class Plan:
    """What one view means for the guards handed out."""

    #: New grants: a guard each.
    added: List[HeldGrant] = field(default_factory=list)
    #: Guards to lose with a hand-off (their grants still to release).
    handed_off: List[HandedOff] = field(default_factory=list)
    #: Guards to lose (``(resource, token)``): their grants ended without a hand-off.
    removed: List[Tuple[str, int]] = field(default_factory=list)
    #: Resources to release at once: moved away before any guard was handed out for them.
    release_now: List[str] = field(default_factory=list)
    #: Every resource held and assigned now, in name order.
    held: List[str] = field(default_factory=list)


HELD = "held"
RELEASING = "releasing"


class Book:
    """The grants a member has handed out: resource → (token or None, stage)."""

    def __init__(self) -> None:
        self._known: Dict[str, Tuple[Optional[int], str]] = {}

    def holds(self, resource: str, token: int) -> bool:
        """Whether the grant of ``resource`` with ``token`` is still the member's (held, or
        handed off and not released yet), as far as the last view says."""
        known = self._known.get(resource)
        return known is not None and known[0] == token

    def clear(self) -> None:
        """Forgets everything (a new session: nothing of the old one is held any more)."""
        self._known.clear()

    def apply(self, view: MemberView) -> Plan:
        """Takes in ``view``; what to do with the guards."""
        plan = Plan()
        evicted = view.state == EVICTED
        view_held = () if evicted else view.held
        view_releasing = () if evicted else view.releasing
        held = {h.resource: h for h in view_held}
        releasing = {r.resource: r.deadline_ms for r in view_releasing}
        nxt: Dict[str, Tuple[Optional[int], str]] = {}
        for resource, (token, stage) in self._known.items():
            h = held.get(resource)
            if h is not None:
                if stage == HELD and token == h.token:
                    nxt[resource] = (token, stage)
                elif stage == HELD and token is not None:
                    plan.removed.append((resource, token))  # a new grant of it, taken in below
            elif resource in releasing:
                if stage == HELD and token is not None:
                    plan.handed_off.append(HandedOff(resource, token, releasing[resource]))
                nxt[resource] = (token, RELEASING)
            elif stage == HELD and token is not None:
                plan.removed.append((resource, token))
        for h in view_held:
            if h.resource not in nxt:
                nxt[h.resource] = (h.token, HELD)
                plan.added.append(h)
        for r in view_releasing:
            if r.resource not in nxt and r.resource not in held:
                nxt[r.resource] = (None, RELEASING)
                plan.release_now.append(r.resource)
        plan.held = sorted(held)
        self._known = nxt
        return plan


def releasing_deadline(received: float, deadline_ms: int) -> float:
    """The deadline, on :func:`time.monotonic`'s clock, of a hand-off told ``deadline_ms`` before
    the service revokes it in an answer that arrived at ``received``: less a margin of a tenth of
    it, at least 0.1 s."""
    left = max(deadline_ms, 0) / 1000.0
    return received + max(left - max(left / 10.0, 0.1), 0.0)
