"""The exceptions of this package: every failure is a :class:`LeaseProxyError`."""

from __future__ import annotations

from typing import Optional

PROBLEM_PREFIX = "https://lease-proxy.dev/problems/"


class LeaseProxyError(Exception):
    """Base class of every error this package raises."""


class Held(LeaseProxyError):
    """The resource is held by someone else (409 ``lease-held``)."""

    def __init__(self, holder: str, token: int, expires_in_ms: int) -> None:
        super().__init__(f"held by {holder!r} (token {token}) for up to {expires_in_ms} ms")
        #: Who holds the resource.
        self.holder = holder
        #: The holder's token (etcd create revision).
        self.token = token
        #: Remaining TTL of the holder's lease, as the proxy saw it.
        self.expires_in_ms = expires_in_ms


class Lost(LeaseProxyError):
    """The lease has ended (410 ``lease-lost``, expired, revoked or released): stop acting as holder."""


class SessionLost(LeaseProxyError):
    """The session has ended (410 ``session-lost``): every lease under it is lost."""


class Compacted(LeaseProxyError):
    """A watch's resume point is no longer in etcd's history (410 ``events-compacted``):
    list the leases again and watch without ``last_event_id``."""


class Problem(LeaseProxyError):
    """Any other error answer of the proxy (``application/problem+json``)."""

    def __init__(self, status: int, type: str, title: str, detail: Optional[str]) -> None:
        super().__init__(f"{status} {title}" + (f": {detail}" if detail else ""))
        #: HTTP status.
        self.status = status
        #: The problem type URI (``https://lease-proxy.dev/problems/<slug>``).
        self.type = type
        #: Short summary.
        self.title = title
        #: Explanation of this occurrence, when the proxy gave one.
        self.detail = detail

    @property
    def slug(self) -> str:
        """The last part of :attr:`type` (``lease-held``, ``forbidden``…)."""
        return self.type.rsplit("/", 1)[-1]


class ProtocolError(LeaseProxyError):
    """The proxy's answer does not make sense: not JSON, not an object, a field missing or of the
    wrong type, a number that is not finite, a body or an event-stream line over the size limit
    (1 MiB), or an event of a watch that does not parse."""

    def __init__(self, status: Optional[int], problem: str) -> None:
        super().__init__(f"malformed answer ({status}): {problem}" if status else f"malformed answer: {problem}")
        #: HTTP status of the answer (None when there was none).
        self.status = status
        #: What was wrong with it.
        self.problem = problem


class InjectedRefusal(LeaseProxyError):
    """A stale-token refusal injected by the client's test mode (``token_refusal_rate``) into
    :func:`~lease_proxy_client.admit`, nothing sent: what PostgreSQL's ``fencing.admit`` raises
    for a token below the resource's mark, SQLSTATE :attr:`sqlstate` ``23F01``."""

    #: The SQLSTATE of a stale token, as the driver's error carries it (psycopg: ``e.sqlstate``).
    sqlstate = "23F01"


class TransportError(LeaseProxyError):
    """The proxy could not be reached or did not answer in time (the ``httpx`` error is the cause)."""
