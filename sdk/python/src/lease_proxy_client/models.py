"""What the proxy answers, as plain data classes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional


@dataclass(frozen=True)
class Grant:
    """A successful acquire (the only answer that carries the secret)."""

    resource: str
    holder: str
    lease_id: str
    secret: str
    token: int
    fencing_token: str
    ttl_seconds: int
    expires_in_ms: int
    session: Optional[str] = None
    metadata: Optional[Dict[str, Any]] = None

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> "Grant":
        """Parses a 201 body of ``POST /v1/leases/{resource}``."""
        return cls(
            resource=_str(body["resource"]),
            holder=_str(body["holder"]),
            lease_id=_str(body["lease_id"]),
            secret=_str(body["secret"]),
            token=_int(body["token"]),
            fencing_token=_str(body["fencing_token"]),
            ttl_seconds=_int(body["ttl_seconds"]),
            expires_in_ms=_int(body["expires_in_ms"]),
            session=_opt_str(body.get("session")),
            metadata=_opt_dict(body.get("metadata")),
        )


@dataclass(frozen=True)
class Renewal:
    """A successful renewal."""

    ttl_seconds: int
    expires_in_ms: int
    token: int

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> "Renewal":
        """Parses a 200 body of ``POST /v1/leases/{resource}/renew``."""
        return cls(
            ttl_seconds=_int(body["ttl_seconds"]),
            expires_in_ms=_int(body["expires_in_ms"]),
            token=_int(body["token"]),
        )


@dataclass(frozen=True)
class Holding:
    """A held resource as anyone may see it (no secret)."""

    resource: str
    holder: str
    lease_id: str
    token: int
    ttl_seconds: int
    expires_in_ms: int
    acquired_at: int
    session: Optional[str] = None
    metadata: Optional[Dict[str, Any]] = None

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> "Holding":
        """Parses ``GET /v1/leases/{resource}`` or one entry of the listing."""
        return cls(
            resource=_str(body["resource"]),
            holder=_str(body["holder"]),
            lease_id=_str(body["lease_id"]),
            token=_int(body["token"]),
            ttl_seconds=_int(body["ttl_seconds"]),
            expires_in_ms=_int(body["expires_in_ms"]),
            acquired_at=_int(body.get("acquired_at", 0)),
            session=_opt_str(body.get("session")),
            metadata=_opt_dict(body.get("metadata")),
        )


@dataclass(frozen=True)
class SessionGrant:
    """A session just opened (the only answer that carries its secret)."""

    session_id: str
    holder: str
    secret: str
    ttl_seconds: int
    expires_in_ms: int

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> "SessionGrant":
        """Parses a 201 body of ``POST /v1/sessions``."""
        return cls(
            session_id=_str(body["session_id"]),
            holder=_str(body["holder"]),
            secret=_str(body["secret"]),
            ttl_seconds=_int(body["ttl_seconds"]),
            expires_in_ms=_int(body["expires_in_ms"]),
        )


@dataclass(frozen=True)
class Event:
    """One ownership change from ``GET /v1/watch``."""

    #: The event id (opaque; resume after it with ``last_event_id``).
    id: str
    #: ``acquired``, ``released`` or ``expired``.
    type: str
    resource: str
    holder: str
    #: The grant's token (create revision).
    token: int
    #: The etcd revision of this event.
    revision: int
    lease_id: str
    session: Optional[str] = None

    @classmethod
    def from_json(cls, id: str, body: Mapping[str, Any]) -> "Event":
        """Parses the ``data`` of one event."""
        return cls(
            id=id,
            type=_str(body["type"]),
            resource=_str(body["resource"]),
            holder=_str(body["holder"]),
            token=_int(body["token"]),
            revision=_int(body["revision"]),
            lease_id=_str(body["lease_id"]),
            session=_opt_str(body.get("session")),
        )


@dataclass(frozen=True)
class FleetMember:
    """A member as a reader of its fleet sees it."""

    member: str
    weight: int
    #: ``active``, ``draining`` or ``evicted``.
    state: str
    #: What it holds and is assigned, in name order.
    held: List[str]
    #: What it holds and must give up, in name order.
    releasing: List[str]

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> "FleetMember":
        return cls(
            member=_str(body["member"]),
            weight=_int(body["weight"]),
            state=_str(body["state"]),
            held=_strs(body["held"]),
            releasing=_strs(body["releasing"]),
        )


@dataclass(frozen=True)
class FleetView:
    """A fleet as it stands (``GET /v1/fleets/{fleet}``; ``PUT`` answers the same without
    ``members`` and ``unassigned``)."""

    fleet: str
    resources: List[str]
    drain_ms: int
    max_moves: int
    #: The etcd revision it was read (or written) at.
    revision: int
    members: List[FleetMember]
    #: The resources no member holds now, in name order.
    unassigned: List[str]

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> "FleetView":
        members = body.get("members", [])
        if not isinstance(members, list):
            raise TypeError("members is not a list")
        return cls(
            fleet=_str(body["fleet"]),
            resources=_strs(body["resources"]),
            drain_ms=_int(body["drain_ms"]),
            max_moves=_int(body["max_moves"]),
            revision=_int(body["revision"]),
            members=[FleetMember.from_json(_opt_dict(m) or {}) for m in members],
            unassigned=_strs(body.get("unassigned", [])),
        )


# Strict readers: a field of the wrong type raises TypeError or ValueError, which the caller
# (protocol.parse) turns into a ProtocolError.


def _int(value: Any) -> int:
    """An integer, or its decimal string (tokens and revisions are strings): never a bool, null,
    a non-finite or fractional number."""
    if isinstance(value, bool) or not isinstance(value, (int, str, float)):
        raise TypeError(f"not an integer: {value!r}")
    if isinstance(value, float) and not value.is_integer():
        raise ValueError(f"not an integer: {value!r}")
    return int(value)


def _str(value: Any) -> str:
    """A string (or a number, some ids being numbers in JSON): never null, a bool, a list."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise TypeError(f"not a string: {value!r}")
    return str(value)


def _strs(value: Any) -> List[str]:
    if not isinstance(value, list):
        raise TypeError(f"not a list: {value!r}")
    return [_str(v) for v in value]


def _opt_str(value: Any) -> Optional[str]:
    return None if value is None else _str(value)


def _opt_dict(value: Any) -> Optional[Dict[str, Any]]:
    if value is not None and not isinstance(value, dict):
        raise TypeError(f"not an object: {value!r}")
    return value
