"""What the sync and asyncio guards show of themselves, written once: a lease's grant and a
session's, with the deadline and lost signal of their liveness (a thread-backed
:class:`~lease_proxy_client.liveness.Liveness` or its asyncio twin)."""

from __future__ import annotations

from typing import Generic, Optional, Protocol, TypeVar

from .models import Grant, SessionGrant

LostT = TypeVar("LostT", covariant=True)


class LivenessLike(Protocol[LostT]):
    """The part of a liveness the views read."""

    @property
    def deadline(self) -> float: ...

    @property
    def lost(self) -> LostT: ...

    @property
    def reason(self) -> Optional[str]: ...

    def check(self) -> None: ...


class Alive(Generic[LostT]):
    """A guard's deadline and lost signal."""

    _liveness: LivenessLike[LostT]

    @property
    def deadline(self) -> float:
        """The stop-by deadline of the lease (or session) on :func:`time.monotonic`'s clock: the
        instant read before sending the last successful acquire/renewal/keepalive plus the
        ``expires_in_ms`` answered, less the client's safety margin (a lease under a session: the
        session's)."""
        return self._liveness.deadline

    @property
    def lost(self) -> LostT:
        """Set when the lease (or session) is lost — at the deadline at the latest."""
        return self._liveness.lost

    @property
    def lost_injected(self) -> bool:
        """Whether the test mode caused the loss (:class:`~lease_proxy_client.TestMode`)."""
        return bool(getattr(self._liveness, "injected", False))

    @property
    def lost_reason(self) -> Optional[str]:
        """None while held, else ``expired``, ``revoked``, ``session-lost`` (a lease under a
        session that ended), ``released`` (released, or its session closed) or ``handed-off`` (a
        fleet moved its resource to another member)."""
        self._liveness.check()
        return self._liveness.reason


class LeaseView(Alive[LostT]):
    """The grant behind a lease guard, and its liveness."""

    _grant: Grant

    @property
    def grant(self) -> Grant:
        """The proxy's answer to the acquire."""
        return self._grant

    @property
    def resource(self) -> str:
        """The resource held."""
        return self._grant.resource

    @property
    def holder(self) -> str:
        """The holder name."""
        return self._grant.holder

    @property
    def lease_id(self) -> str:
        """The etcd lease id (decimal; the session id for a lease under a session)."""
        return self._grant.lease_id

    @property
    def secret(self) -> str:
        """Proof of holding (``Lease-Secret``)."""
        return self._grant.secret

    @property
    def token(self) -> int:
        """The fencing token's revision: larger for every later holder."""
        return self._grant.token

    @property
    def fencing_token(self) -> str:
        """The signed fencing token, for the ``Fencing-Token`` header of protected storage."""
        return self._grant.fencing_token

    @property
    def session_id(self) -> Optional[str]:
        """The session this lease lives on, if any."""
        return self._grant.session


class SessionView(Alive[LostT]):
    """The answer behind a session guard, and its liveness."""

    _grant: SessionGrant

    @property
    def id(self) -> str:
        """The session id (its etcd lease id, decimal)."""
        return self._grant.session_id

    @property
    def holder(self) -> str:
        """Who opened it."""
        return self._grant.holder

    @property
    def secret(self) -> str:
        """The session's secret (``Lease-Secret`` of its keepalives and acquires)."""
        return self._grant.secret

    @property
    def ttl_seconds(self) -> int:
        """The session's TTL."""
        return self._grant.ttl_seconds
