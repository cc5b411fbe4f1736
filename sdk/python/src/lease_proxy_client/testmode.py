"""The test mode, FoundationDB's client-side buggify for leases, for an application's own tests.

A client made with ``test_mode=TestMode(...)`` injects faults at set rates — a lease (or
session) lost when a renewal is due, a renewal sent late, a renewal attempt failed without being
sent, a write's fencing token refused as stale — so that the application's on-lost and
on-refused paths run. Losses reach the application exactly as real ones do (``lost`` set,
``lost_reason``), marked by ``lost_injected``; a refusal as fence-gateway's 409 or PostgreSQL's
23F01 does, marked ``injected``.

With ``TestMode(fake=FakeProxy())`` the client needs no proxy at all: :class:`FakeProxy` is an
in-memory lease-proxy behind the client's HTTP transport, so the SDK's own acquire, renewal,
deadline and loss code runs unchanged against it. Grants expire at their TTL when not renewed,
tokens increase with every grant, and :meth:`FakeProxy.lose` takes a grant away as a revoked
etcd lease would (the holder learns it at its next renewal, ``revoked``). Never in production.
"""

from __future__ import annotations

import asyncio
import json
import random
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Optional, Tuple
from urllib.parse import unquote

import httpx

from .errors import PROBLEM_PREFIX

#: A guard lost when its renewal was due, as if the proxy had refused it (the grant is released).
LOSS = "loss"
#: A renewal sent late, by up to the lifetime last granted (it may cross the deadline).
LATE_RENEWAL = "late-renewal"
#: A renewal attempt failed without being sent (retried as a transport failure is).
FAILED_RENEWAL = "failed-renewal"
#: A write's fencing token refused as stale without being sent: ``Lease.forward`` answers
#: fence-gateway's 409 ``stale-fencing-token``, :func:`~lease_proxy_client.admit` raises
#: :class:`~lease_proxy_client.errors.InjectedRefusal` (SQLSTATE 23F01).
TOKEN_REFUSAL = "token-refusal"


@dataclass(frozen=True)
class TestMode:
    """The rates (0 to 1) at which each chance fires: ``loss_rate`` and ``late_renewal_rate``
    per renewal due, ``failed_renewal_rate`` per renewal attempt, ``token_refusal_rate`` per
    ``Lease.forward`` or :func:`~lease_proxy_client.admit`. ``seed`` repeats a run's draws;
    ``on_fault(kind, path)`` is told of each fault (``kind`` one of :data:`LOSS`,
    :data:`LATE_RENEWAL`, :data:`FAILED_RENEWAL`, :data:`TOKEN_REFUSAL`; ``path`` the guard's
    renewal path, ``/v1/leases/{resource}/renew`` or ``/v1/sessions/{id}/keepalive``, or for a
    token refusal the resource). ``fake``, when set, is
    the :class:`FakeProxy` the client talks to instead of its ``base_url`` (several clients may
    share one)."""

    __test__ = False  # not a pytest test class

    loss_rate: float = 0.0
    late_renewal_rate: float = 0.0
    failed_renewal_rate: float = 0.0
    seed: Optional[int] = None
    on_fault: Optional[Callable[[str, str], None]] = None
    fake: Optional["FakeProxy"] = field(default=None, compare=False)
    token_refusal_rate: float = 0.0


class Faults:
    """A client's dice (thread-safe); without a test mode nothing ever fires."""

    def __init__(self, mode: Optional[TestMode]) -> None:
        self.mode = mode
        #: The in-memory proxy to use as the client's transport, if any.
        self.fake = mode.fake if mode is not None else None
        self._rng = random.Random(mode.seed if mode is not None else None)
        self._lock = threading.Lock()

    def fires(self, kind: str, path: str) -> bool:
        """Whether the chance of a ``kind`` fault fires now for the guard renewed at ``path``
        (told to ``on_fault``)."""
        mode = self.mode
        if mode is None:
            return False
        rate = {
            LOSS: mode.loss_rate,
            LATE_RENEWAL: mode.late_renewal_rate,
            FAILED_RENEWAL: mode.failed_renewal_rate,
            TOKEN_REFUSAL: mode.token_refusal_rate,
        }[kind]
        if rate <= 0.0:
            return False
        with self._lock:
            hit = self._rng.random() < rate
        if hit and mode.on_fault is not None:
            mode.on_fault(kind, path)
        return hit

    def late_by(self, lifetime: float) -> float:
        """How late a late renewal goes: up to ``lifetime`` seconds."""
        with self._lock:
            return self._rng.uniform(0.0, lifetime)


def injected_refusal(resource: str) -> httpx.Response:
    """fence-gateway's answer to a write whose token is below the resource's mark, as the test
    mode injects it (``injected`` set in the problem)."""
    body = dict(
        type=PROBLEM_PREFIX + "stale-fencing-token", title="Conflict", status=409,
        detail=f"injected by the client's test mode: a newer holder of {resource} has written", injected=True,
    )  # fmt: skip
    headers = {"content-type": "application/problem+json", "fencing-rejection": "stale-fencing-token"}
    return httpx.Response(409, json=body, headers=headers)


@dataclass
class _Grant:
    holder: str
    secret: str
    token: int
    ttl: int
    expires_at: float
    session: Optional[str]
    metadata: Optional[Dict[str, Any]]


@dataclass
class _Session:
    holder: str
    secret: str
    ttl: int
    expires_at: float


def _problem(status: int, slug: str, detail: str, **extra: Any) -> httpx.Response:
    body = dict(type=PROBLEM_PREFIX + slug, title=slug, status=status, detail=detail, **extra)
    return httpx.Response(status, json=body, headers={"content-type": "application/problem+json"})


class FakeProxy(httpx.BaseTransport, httpx.AsyncBaseTransport):
    """An in-memory lease-proxy, the transport of a client made with ``TestMode(fake=...)``.

    It answers the lease and session routes as the proxy does — acquire (``wait`` included),
    renew, release, get, open, keepalive and close a session: 409 ``lease-held``, 410
    ``lease-lost``/``session-lost`` — and 404 ``no-route`` to anything else (the event stream,
    forward, list, fleets), so a guard learns of a loss at its next renewal. A grant or session
    not renewed is gone ``ttl_seconds`` after its last renewal; every grant gets a larger
    ``token`` than any before it. Thread-safe; one may serve sync and asyncio clients together.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last_token = 0
        self._leases: Dict[str, _Grant] = {}
        self._sessions: Dict[str, _Session] = {}

    def lose(self, resource: str) -> bool:
        """Takes the grant of ``resource`` away as a revoked etcd lease would (a grant under a
        session ends with its whole session, as it shares its etcd lease): its holder's next
        renewal is refused and the guard lost, ``revoked`` (its leases ``session-lost``). False
        when nobody held it."""
        with self._lock:
            self._expire(time.monotonic())
            grant = self._leases.pop(resource, None)
            if grant is not None and grant.session is not None:
                self._end_session(grant.session)
            return grant is not None

    # --- the transport ---

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        body = request.read()
        started = time.monotonic()
        while True:
            response = self._answer(request, body, time.monotonic() - started)
            if response is not None:
                return response
            time.sleep(0.01)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = await request.aread()
        started = time.monotonic()
        while True:
            response = self._answer(request, body, time.monotonic() - started)
            if response is not None:
                return response
            await asyncio.sleep(0.01)

    # --- the proxy ---

    def _expire(self, now: float) -> None:
        for sid in [sid for sid, s in self._sessions.items() if s.expires_at <= now]:
            self._end_session(sid)
        for resource in [r for r, g in self._leases.items() if g.session is None and g.expires_at <= now]:
            del self._leases[resource]

    def _end_session(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)
        for resource in [r for r, g in self._leases.items() if g.session == session_id]:
            del self._leases[resource]

    def _answer(self, request: httpx.Request, content: bytes, waited: float) -> Optional[httpx.Response]:
        """The answer to ``request``, or None for an acquire still waiting to be granted."""
        parts = [unquote(p) for p in request.url.raw_path.split(b"?")[0].decode().split("/")[1:]]
        method, secret = request.method, request.headers.get("Lease-Secret", "")
        try:
            body: Dict[str, Any] = json.loads(content) if content else {}
        except ValueError:
            return _problem(400, "bad-request", "the body is not JSON")
        with self._lock:
            now = time.monotonic()
            self._expire(now)
            if parts[:2] == ["v1", "leases"] and len(parts) == 3:
                if method == "POST":
                    return self._acquire(parts[2], body, secret, now, waited)
                if method == "GET":
                    return self._get(parts[2], now)
                if method == "DELETE":
                    grant = self._leases.get(parts[2])
                    if grant is not None and grant.secret == secret:
                        del self._leases[parts[2]]
                    return httpx.Response(204)
            if parts[:2] == ["v1", "leases"] and len(parts) == 4 and parts[3] == "renew" and method == "POST":
                grant = self._leases.get(parts[2])
                if grant is None or grant.secret != secret:
                    return _problem(410, "lease-lost", f"{parts[2]}: no grant of this secret")
                ttl, left = self._renew(grant, now)
                return httpx.Response(200, json=self._timing(parts[2], grant, ttl, left))
            if parts[:2] == ["v1", "sessions"]:
                if len(parts) == 2 and method == "POST":
                    return self._open(body, now)
                session = self._sessions.get(parts[2]) if len(parts) >= 3 else None
                proven = session is not None and session.secret == secret
                if len(parts) == 3 and method == "DELETE":
                    if proven:
                        self._end_session(parts[2])
                    return httpx.Response(204)
                if len(parts) == 4 and parts[3] == "keepalive" and method == "POST":
                    if session is None or not proven:
                        return _problem(410, "session-lost", f"session {parts[2]} ended")
                    session.expires_at = now + session.ttl
                    timing = {"ttl_seconds": session.ttl, "expires_in_ms": session.ttl * 1000}
                    return httpx.Response(200, json=dict(timing, session_id=parts[2]))
        return _problem(404, "no-route", f"{method} {request.url.path}: not served by the fake proxy")

    def _expires_at(self, grant: _Grant) -> float:
        return self._sessions[grant.session].expires_at if grant.session is not None else grant.expires_at

    def _next_token(self) -> int:
        self._last_token += 1
        return self._last_token

    def _renew(self, grant: _Grant, now: float) -> Tuple[int, float]:
        """Renews ``grant`` (its session, if under one): its TTL and the seconds left."""
        if grant.session is not None:
            session = self._sessions[grant.session]
            session.expires_at = now + session.ttl
            return session.ttl, session.ttl
        grant.expires_at = now + grant.ttl
        return grant.ttl, grant.ttl

    @staticmethod
    def _timing(resource: str, grant: _Grant, ttl: int, left: float) -> Dict[str, Any]:
        return {
            "ttl_seconds": ttl,
            "expires_in_ms": max(int(left * 1000), 0),
            "token": str(grant.token),
            "fencing_token": f"v1.test.{resource}.{grant.token}",
        }

    def _acquire(
        self, resource: str, body: Dict[str, Any], secret: str, now: float, waited: float
    ) -> Optional[httpx.Response]:
        holder, session_id = str(body.get("holder", "")), body.get("session")
        session = self._sessions.get(str(session_id)) if session_id is not None else None
        if session_id is not None and (session is None or session.secret != secret):
            return _problem(410, "session-lost", f"session {session_id} ended")
        ttl = session.ttl if session is not None else body.get("ttl_seconds")
        if not isinstance(ttl, int) or isinstance(ttl, bool) or ttl <= 0:
            return _problem(400, "bad-request", "ttl_seconds must be a positive integer")
        held = self._leases.get(resource)
        if held is not None:
            left = self._expires_at(held) - now
            if waited * 1000 < int(body.get("wait_ms") or 0):
                return None
            return _problem(
                409, "lease-held", f"{resource} is held", holder=held.holder, token=str(held.token),
                expires_in_ms=max(int(left * 1000), 0),
            )
        token, metadata = self._next_token(), body.get("metadata")
        grant = _Grant(holder, secrets.token_urlsafe(16), token, ttl, now + ttl, session_id, metadata)
        if session is not None:
            session.expires_at = now + ttl  # an acquire under a session renews it too
        self._leases[resource] = grant
        answer = dict(self._timing(resource, grant, ttl, ttl), resource=resource, holder=holder,
                      lease_id=str(grant.token), secret=grant.secret)
        if session_id is not None:
            answer["session"] = session_id
        if grant.metadata is not None:
            answer["metadata"] = grant.metadata
        return httpx.Response(201, json=answer)

    def _get(self, resource: str, now: float) -> httpx.Response:
        grant = self._leases.get(resource)
        if grant is None:
            return _problem(404, "not-found", f"{resource} is free")
        answer: Dict[str, Any] = {
            "resource": resource,
            "holder": grant.holder,
            "lease_id": str(grant.token),
            "token": str(grant.token),
            "ttl_seconds": grant.ttl,
            "expires_in_ms": max(int((self._expires_at(grant) - now) * 1000), 0),
        }
        if grant.session is not None:
            answer["session"] = grant.session
        if grant.metadata is not None:
            answer["metadata"] = grant.metadata
        return httpx.Response(200, json=answer)

    def _open(self, body: Dict[str, Any], now: float) -> httpx.Response:
        ttl = body.get("ttl_seconds")
        if not isinstance(ttl, int) or isinstance(ttl, bool) or ttl <= 0:
            return _problem(400, "bad-request", "ttl_seconds must be a positive integer")
        session_id = str(self._next_token())
        session = _Session(str(body.get("holder", "")), secrets.token_urlsafe(16), ttl, now + ttl)
        self._sessions[session_id] = session
        return httpx.Response(
            201,
            json={"session_id": session_id, "holder": session.holder, "secret": session.secret,
                  "ttl_seconds": ttl, "expires_in_ms": ttl * 1000},
        )
