"""The HTTP contract, shared by the sync and the asyncio client: how each call is sent, how each
answer is read, and the timing rules of the guards (renewal interval, retry backoff)."""

from __future__ import annotations

import json
import random
import ssl
from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional, Tuple, Union
from urllib.parse import quote

import httpx

from .errors import PROBLEM_PREFIX, Compacted, Held, LeaseProxyError, Lost, Problem, SessionLost

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


def error_for(response: httpx.Response) -> LeaseProxyError:
    """The exception for a non-2xx answer (its body must have been read)."""
    body: Mapping[str, Any] = {}
    try:
        parsed = json.loads(response.content or b"{}")
        if isinstance(parsed, dict):
            body = parsed
    except ValueError:
        pass
    kind = str(body.get("type", "about:blank"))
    slug = kind[len(PROBLEM_PREFIX) :] if kind.startswith(PROBLEM_PREFIX) else ""
    if response.status_code == 409 and slug == "lease-held":
        return Held(
            holder=str(body.get("holder", "")),
            token=int(body.get("token", 0)),
            expires_in_ms=int(body.get("expires_in_ms", 0)),
        )
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


def is_lost_answer(response: httpx.Response) -> bool:
    """A 410 ``lease-lost``/``session-lost`` problem from the proxy (not an upstream's 410)."""
    return response.status_code == 410 and isinstance(error_for(response), (Lost, SessionLost))


def check(response: httpx.Response) -> httpx.Response:
    """Raises the matching exception unless the answer is a 2xx (its body must have been read)."""
    if response.is_success:
        return response
    raise error_for(response)


def renew_interval(ttl_seconds: float, expires_in_ms: int) -> float:
    """Seconds until the next renewal: a third of the lifetime just granted, ±10 % jitter (so many
    holders started together do not renew in lockstep)."""
    lifetime = min(float(ttl_seconds), expires_in_ms / 1000.0)
    return lifetime / 3.0 * random.uniform(0.9, 1.1)


def retry_backoff(attempt: int) -> float:
    """Seconds before retry number ``attempt`` (0-based) of a failed renewal: short, growing."""
    return min(0.1 * 2.0**attempt, 1.0) * random.uniform(0.8, 1.2)


def is_transient(error: BaseException) -> bool:
    """Worth retrying: the proxy unreachable or slow, or an answer of 429 or 5xx."""
    if isinstance(error, httpx.TransportError):
        return True
    return isinstance(error, Problem) and (error.status >= 500 or error.status == 429)
