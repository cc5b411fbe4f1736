"""The HTTP contract, shared by the sync and the asyncio client: how each call is sent, how each
answer is read, and the timing rules of the guards (renewal interval, retry backoff)."""

from __future__ import annotations

import json
import random
import re
import ssl
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple, TypeVar, Union
from urllib.parse import quote

import httpx

from .errors import (
    PROBLEM_PREFIX,
    Compacted,
    Held,
    LeaseProxyError,
    Lost,
    Problem,
    ProtocolError,
    SessionLost,
    TransportError,
)
from .models import Holding, _int

T = TypeVar("T")

#: The most bytes an answer's body may have; a longer one is a :class:`ProtocolError`.
MAX_BODY = 1 << 20
#: The most bytes an event-stream line, or the data of one message, may have.
MAX_LINE = 1 << 20
#: The most time one answer may grant (2^31 s): beyond any real TTL, keeps every timer finite.
MAX_LIFETIME_MS = 2**31 * 1000
#: The shortest pause between two renewals, whatever the answers say.
MIN_RENEW_INTERVAL = 0.1

#: The header proving a grant or a session.
SECRET_HEADER = "Lease-Secret"

#: What ``verify=`` accepts: ``True`` (the usual CAs), ``False`` or a CA bundle file.
Verify = Union[bool, str]
#: What ``cert=`` accepts: a PEM file with the certificate and its key, or ``(cert, key)`` files.
Cert = Union[str, Tuple[str, str]]

#: Lost reasons (``lease.lost_reason``).
EXPIRED = "expired"
REVOKED = "revoked"
SESSION_LOST = "session-lost"
RELEASED = "released"
#: A fleet moved the resource to another member: finish, then release it.
HANDED_OFF = "handed-off"


@dataclass
class Call:
    """One request to send: method, path (already quoted), headers, JSON body, extra seconds of
    timeout (for a waiting acquire)."""

    method: str
    path: str
    headers: Dict[str, str] = field(default_factory=dict)
    json: Optional[Dict[str, Any]] = None
    params: Optional[Dict[str, str]] = None
    extra_timeout: float = 0.0


def lease_path(resource: str) -> str:
    """``/v1/leases/{resource}``."""
    return "/v1/leases/" + quote(resource, safe="")


def acquire_call(
    resource: str,
    *,
    holder: str,
    ttl: Optional[int],
    wait: Optional[float],
    idempotency_key: Optional[str],
    metadata: Optional[Mapping[str, Any]],
    session: Optional[str] = None,
    session_secret: Optional[str] = None,
) -> Call:
    """``POST /v1/leases/{resource}``: with ``session`` the grant lives on the session (no TTL)."""
    body: Dict[str, Any] = {"holder": holder}
    if ttl is not None:
        body["ttl_seconds"] = ttl
    if wait is not None:
        body["wait_ms"] = int(wait * 1000)
    if metadata is not None:
        body["metadata"] = dict(metadata)
    headers: Dict[str, str] = {}
    if session is not None:
        body["session"] = session
        headers[SECRET_HEADER] = session_secret or ""
    if idempotency_key is not None:
        headers["Idempotency-Key"] = idempotency_key
    return Call("POST", lease_path(resource), headers, body, extra_timeout=wait or 0.0)


def renew_call(resource: str, secret: str) -> Call:
    """``POST /v1/leases/{resource}/renew``."""
    return Call("POST", lease_path(resource) + "/renew", {SECRET_HEADER: secret})


def release_call(resource: str, secret: str) -> Call:
    """``DELETE /v1/leases/{resource}`` (idempotent)."""
    return Call("DELETE", lease_path(resource), {SECRET_HEADER: secret})


def get_call(resource: str) -> Call:
    """``GET /v1/leases/{resource}``."""
    return Call("GET", lease_path(resource))


def list_call(prefix: str, cursor: Optional[str], limit: Optional[int]) -> Call:
    """One page of ``GET /v1/leases``."""
    params: Dict[str, str] = {}
    if prefix:
        params["prefix"] = prefix
    if cursor is not None:
        params["cursor"] = cursor
    if limit is not None:
        params["limit"] = str(limit)
    return Call("GET", "/v1/leases", params=params)


def forward_path(resource: str, path: str) -> str:
    """``/v1/leases/{resource}/forward/{path}``."""
    return lease_path(resource) + "/forward/" + path.lstrip("/")


def open_session_call(holder: str, ttl: int) -> Call:
    """``POST /v1/sessions``."""
    return Call("POST", "/v1/sessions", json={"holder": holder, "ttl_seconds": ttl})


def session_path(session_id: str) -> str:
    """``/v1/sessions/{id}``."""
    return "/v1/sessions/" + quote(session_id, safe="")


def keepalive_call(session_id: str, secret: str) -> Call:
    """``POST /v1/sessions/{id}/keepalive``."""
    return Call("POST", session_path(session_id) + "/keepalive", {SECRET_HEADER: secret})


def close_session_call(session_id: str, secret: str) -> Call:
    """``DELETE /v1/sessions/{id}`` (idempotent)."""
    return Call("DELETE", session_path(session_id), {SECRET_HEADER: secret})


def fleet_path(fleet: str) -> str:
    """``/v1/fleets/{fleet}``."""
    return "/v1/fleets/" + quote(fleet, safe="")


def member_path(fleet: str, member: str) -> str:
    """``/v1/fleets/{fleet}/members/{member}``."""
    return fleet_path(fleet) + "/members/" + quote(member, safe="")


def put_fleet_call(
    fleet: str, resources: List[str], drain: Optional[float], max_moves: Optional[int]
) -> Call:
    """``PUT /v1/fleets/{fleet}``: ``drain`` in seconds (whole milliseconds are sent)."""
    body: Dict[str, Any] = {"resources": list(resources)}
    if drain is not None:
        body["drain_ms"] = int(drain * 1000)
    if max_moves is not None:
        body["max_moves"] = max_moves
    return Call("PUT", fleet_path(fleet), json=body)


def join_call(fleet: str, member: str, ttl: int, weight: Optional[int]) -> Call:
    """``POST /v1/fleets/{fleet}/members``."""
    body: Dict[str, Any] = {"member": member, "ttl_seconds": ttl}
    if weight is not None:
        body["weight"] = weight
    return Call("POST", fleet_path(fleet) + "/members", json=body)


def member_view_call(fleet: str, member: str, secret: str, after: Optional[int], wait: float) -> Call:
    """``GET /v1/fleets/{fleet}/members/{member}``: at once without ``after``, else a long poll of
    up to ``wait`` seconds for a revision past it."""
    call = Call("GET", member_path(fleet, member), {SECRET_HEADER: secret})
    if after is not None:
        call.params = {"after": str(after), "wait_ms": str(int(wait * 1000))}
        call.extra_timeout = wait
    return call


def drain_call(fleet: str, member: str, secret: Optional[str]) -> Call:
    """``POST …/members/{member}/drain``: the member itself with its session's secret, else an
    operator."""
    return Call("POST", member_path(fleet, member) + "/drain", {SECRET_HEADER: secret} if secret else {})


def is_no_member(error: BaseException) -> bool:
    """A fleet member's read answered 404 ``no-member`` (its session ended), or 410 ``session-lost``."""
    return isinstance(error, SessionLost) or (
        isinstance(error, Problem) and error.status == 404 and error.slug == "no-member"
    )


def watch_headers(last_event_id: Optional[str]) -> Dict[str, str]:
    """Headers of ``GET /v1/watch``, resuming after ``last_event_id``."""
    headers = {"Accept": "text/event-stream"}
    if last_event_id is not None:
        headers["Last-Event-ID"] = last_event_id
    return headers


def tls(verify: Verify, cert: Optional[Cert]) -> Union[bool, ssl.SSLContext]:
    """httpx's ``verify=``: ``True`` keeps httpx's default CAs; a CA file, no verification or a
    client certificate make an :class:`ssl.SSLContext` (with the system's CAs unless a file is
    given)."""
    if verify is True and cert is None:
        return True
    context = ssl.create_default_context(cafile=verify if isinstance(verify, str) else None)
    if verify is False:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if cert is not None:
        certfile, keyfile = (cert, None) if isinstance(cert, str) else cert
        context.load_cert_chain(certfile, keyfile)
    return context


def base_headers(token: Optional[str], user_agent: str) -> Dict[str, str]:
    """Headers on every request: the bearer token when there is one."""
    headers = {"User-Agent": user_agent}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return headers


@dataclass(frozen=True)
class Answer:
    """A whole answer of the proxy, its body read (at most :data:`MAX_BODY` bytes)."""

    status_code: int
    reason_phrase: str
    content: bytes

    @property
    def is_success(self) -> bool:
        """A 2xx."""
        return 200 <= self.status_code < 300


class BodyReader:
    """Collects an answer's body chunk by chunk: refuses it past :data:`MAX_BODY` bytes
    (:class:`ProtocolError`) and past ``deadline`` on :func:`time.monotonic`'s clock
    (:class:`TransportError`), so a server dripping its body cannot outlast the timeout."""

    def __init__(self, response: httpx.Response, deadline: float, what: str) -> None:
        self._response = response
        self._deadline = deadline
        self._what = what
        self._chunks: List[bytes] = []
        self._size = 0

    def feed(self, chunk: bytes) -> None:
        """Takes one chunk of the body."""
        self._size += len(chunk)
        if self._size > MAX_BODY:
            raise ProtocolError(self._response.status_code, f"{self._what}: body over {MAX_BODY} bytes")
        if time.monotonic() > self._deadline:
            raise TransportError(f"{self._what}: the answer did not arrive within the timeout")
        self._chunks.append(chunk)

    def answer(self) -> Answer:
        """The answer, once the body has been read."""
        return Answer(self._response.status_code, self._response.reason_phrase, b"".join(self._chunks))


#: What the answer readers accept: an :class:`Answer`, or an httpx one whose body was read.
AnyAnswer = Union[Answer, httpx.Response]


def _not_finite(constant: str) -> Any:
    raise ValueError(f"{constant} is not a number")


def _describe(error: BaseException) -> str:
    if isinstance(error, KeyError):
        return f"field {error.args[0]!r} missing"
    if isinstance(error, RecursionError):
        return "JSON nested too deeply"
    return f"{type(error).__name__}: {error}"


#: The deepest nesting of arrays and objects an answer may have: the proxy's go three deep.
MAX_NESTING = 32

_STRINGS = re.compile(rb'"(?:[^"\\]|\\.)*"')
_BRACKETS = re.compile(rb"[\[\]{}]")


def _nested_within(content: bytes, limit: int) -> bool:
    """Whether ``content`` nests arrays and objects at most ``limit`` deep (brackets inside
    strings aside), found without recursing: ``json.loads`` would recurse to the interpreter's
    limit first, and a garbage collection run at that depth fails where no caller can catch it."""
    if content.count(b"[") + content.count(b"{") <= limit:
        return True
    depth = 0
    for bracket in _BRACKETS.findall(_STRINGS.sub(b"", content)):
        depth += 1 if bracket in (b"[", b"{") else -1
        if depth > limit:
            return False
    return True


def _loads(content: bytes, **options: Any) -> Any:
    if not _nested_within(content, MAX_NESTING):
        raise RecursionError("JSON nested too deeply")
    return json.loads(content, **options)


def parse(answer: AnyAnswer, read: Callable[[Mapping[str, Any]], T]) -> T:
    """The one place a 2xx answer is read: its body as a JSON object, given to ``read`` (a
    model's ``from_json``). Anything malformed (not JSON, not an object, NaN or Infinity, nested
    deeper than :data:`MAX_NESTING`, a field missing, null or of the wrong type) raises
    :class:`ProtocolError`."""
    try:
        body = _loads(answer.content, parse_constant=_not_finite)
        if not isinstance(body, dict):
            raise TypeError(f"the body is not a JSON object but {type(body).__name__}")
        return read(body)
    except (ValueError, TypeError, KeyError, OverflowError, RecursionError) as e:
        raise ProtocolError(answer.status_code, _describe(e)) from e


def timing(body: Mapping[str, Any]) -> Tuple[int, int]:
    """``ttl_seconds`` and ``expires_in_ms`` of a renewal or keepalive answer."""
    return _int(body["ttl_seconds"]), _int(body["expires_in_ms"])


def page(body: Mapping[str, Any]) -> Tuple[List[Holding], Optional[str]]:
    """One page of ``GET /v1/leases``: its holdings and the next cursor (None on the last)."""
    leases = body.get("leases", [])
    if not isinstance(leases, list):
        raise TypeError("leases is not a list")
    cursor = body.get("next_cursor")
    if cursor is not None and not isinstance(cursor, str):
        raise TypeError("next_cursor is not a string")
    return [Holding.from_json(h) if isinstance(h, dict) else _not_an_object(h) for h in leases], cursor or None


def _not_an_object(value: Any) -> Holding:
    raise TypeError(f"not an object: {value!r}")


def error_for(response: AnyAnswer) -> LeaseProxyError:
    """The exception for a non-2xx answer (its body must have been read)."""
    body: Mapping[str, Any] = {}
    try:
        parsed = _loads(response.content or b"{}")
        if isinstance(parsed, dict):
            body = parsed
    except (ValueError, RecursionError):
        pass
    kind = str(body.get("type", "about:blank"))
    slug = kind[len(PROBLEM_PREFIX) :] if kind.startswith(PROBLEM_PREFIX) else ""
    if response.status_code == 409 and slug == "lease-held":
        try:
            return Held(
                holder=str(body.get("holder", "")),
                token=_int(body.get("token", 0)),
                expires_in_ms=_int(body.get("expires_in_ms", 0)),
            )
        except (ValueError, TypeError, OverflowError) as e:
            return ProtocolError(response.status_code, "lease-held: " + _describe(e))
    if response.status_code == 410:
        if slug == "session-lost":
            return SessionLost(str(body.get("detail") or "session lost"))
        if slug == "events-compacted":
            return Compacted(str(body.get("detail") or "events compacted"))
        if slug == "lease-lost":
            return Lost(str(body.get("detail") or "lease lost"))
    return Problem(
        status=response.status_code,
        type=kind,
        title=str(body.get("title", response.reason_phrase)),
        detail=None if body.get("detail") is None else str(body.get("detail")),
    )


def is_lost_answer(response: AnyAnswer) -> bool:
    """A 410 ``lease-lost``/``session-lost`` problem from the proxy (not an upstream's 410)."""
    return response.status_code == 410 and isinstance(error_for(response), (Lost, SessionLost))


def check(response: Answer) -> Answer:
    """Raises the matching exception unless the answer is a 2xx (its body must have been read)."""
    if response.is_success:
        return response
    raise error_for(response)


def lifetime(ttl_seconds: int, expires_in_ms: int, slack: float = 0.0) -> float:
    """Seconds an acquire, renewal or keepalive answer grants from the instant its request was
    sent: its ``expires_in_ms``, but never more than its TTL (plus ``slack``: the wait of a queued
    acquire, the proxy counting the TTL from the grant), nor :data:`MAX_LIFETIME_MS`. 0 when the
    answer makes no sense (``ttl_seconds`` <= 0 or ``expires_in_ms`` < 0): the guard is lost."""
    if ttl_seconds <= 0 or expires_in_ms < 0:
        return 0.0
    most = ttl_seconds * 1000 + int(slack * 1000)
    return min(expires_in_ms, most, MAX_LIFETIME_MS) / 1000.0


def stop_by(sent: float, lifetime: float, safety_margin: Optional[float]) -> float:
    """The stop-by deadline of a grant (or session) whose request was sent at ``sent`` and
    granted ``lifetime`` seconds: ``sent + lifetime - margin``, the margin being ``safety_margin``
    seconds, or by default a tenth of the lifetime, at least 0.1 s — time for the work to notice
    and stop before the server's earliest possible expiry (never more than the lifetime)."""
    margin = max(lifetime / 10.0, 0.1) if safety_margin is None else max(safety_margin, 0.0)
    return sent + lifetime - min(margin, lifetime)


def renew_interval(lifetime: float) -> float:
    """Seconds until the next renewal: a third of the lifetime just granted, ±10 % jitter (so many
    holders started together do not renew in lockstep), at least :data:`MIN_RENEW_INTERVAL`."""
    return max(lifetime / 3.0 * random.uniform(0.9, 1.1), MIN_RENEW_INTERVAL)


def retry_backoff(attempt: int) -> float:
    """Seconds before retry number ``attempt`` (0-based) of a failed renewal: short, growing."""
    return min(0.1 * 2.0**attempt, 1.0) * random.uniform(0.8, 1.2)


def watch_backoff(attempt: int) -> float:
    """Seconds before reconnecting a watch after ``attempt`` (0-based) connections in a row that
    delivered no event: 0.2 s growing to 2 s."""
    return retry_backoff(min(attempt, 5)) * 2


def is_transient(error: BaseException) -> bool:
    """Worth retrying: the proxy unreachable or slow, or an answer of 429 or 5xx."""
    if isinstance(error, httpx.TransportError):
        return True
    return isinstance(error, Problem) and (error.status >= 500 or error.status == 429)
