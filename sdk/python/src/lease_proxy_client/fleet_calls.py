"""The fleet calls of the sync :class:`~lease_proxy_client.Client` (a base class of it): join a
fleet as a member, and the operator's calls — make or change a fleet, read it, end it, drain or
evict a member."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Iterable, Optional, Tuple

from . import protocol
from .fleet import DEFAULT_POLL, Grip, Member, joined_session
from .models import FleetView, Grant

if TYPE_CHECKING:
    from .client import Lease, Session
    from .protocol import Answer, Call


class FleetCalls:
    """Fleets, for :class:`~lease_proxy_client.Client`."""

    def _send(self, call: "Call", timeout: Optional[float] = None) -> "Answer":
        raise NotImplementedError

    def _timed(self, call: "Call", timeout: Optional[float] = None) -> Tuple[float, "Answer"]:
        raise NotImplementedError

    def join_fleet(
        self,
        fleet: str,
        *,
        member: str,
        ttl: int,
        weight: Optional[int] = None,
        rejoin: bool = False,
        poll: float = DEFAULT_POLL,
    ) -> Member:
        """Joins ``fleet`` as ``member``: a session of ``ttl`` seconds kept alive at a third of
        it, and a thread that long-polls the member's assignment (``poll`` seconds at most per
        request; the proxy caps it at its ``--max-wait``). Read the changes with
        :meth:`Member.assignments`, or let :meth:`Member.serve` run work per resource. With
        ``rejoin`` the member joins again under the same name when its session ends (the service
        gives it back what it held if nothing moved it meanwhile); otherwise the assignments end
        with the loss. Joining with the name of a live member of the same principal replaces it."""
        from .client import Session

        def join() -> Session:
            sent, answer = self._timed(protocol.join_call(fleet, member, ttl, weight))
            grant = protocol.parse(answer, lambda body: joined_session(dict(body), member))
            return Session(client, grant, sent)

        client: Any = self
        return Member(client, fleet, member, join(), join, poll, rejoin)

    def _fleet_lease(self, session: "Session", grant: Grant, grip: Grip) -> "Lease":
        """The guard of a fleet grant: it lives on the member's session, and gives the grant
        back only through ``grip`` (once, and only while the member still holds it)."""
        from .client import Lease

        client: Any = self
        return Lease(client, grant, time.monotonic(), session=session, claim=grip.claim)

    def put_fleet(
        self,
        fleet: str,
        resources: Iterable[str],
        *,
        drain: Optional[float] = None,
        max_moves: Optional[int] = None,
    ) -> FleetView:
        """Makes or changes ``fleet``: ``resources`` replace its list; ``drain`` (seconds, whole
        milliseconds sent) is how long a member has to release a resource moved away from it
        (default: the service's, 5 s); ``max_moves`` bounds the hand-offs in flight. The fleet as
        written (its ``members`` and ``unassigned`` empty: :meth:`get_fleet` reads them)."""
        call = protocol.put_fleet_call(fleet, list(resources), drain, max_moves)
        return protocol.parse(self._timed(call)[1], FleetView.from_json)

    def get_fleet(self, fleet: str) -> Optional[FleetView]:
        """``fleet`` as it stands — its members, what each holds and hands off, what nobody
        holds — or None when there is no such fleet."""
        answer = self._send(protocol.Call("GET", protocol.fleet_path(fleet)))
        if answer.status_code == 404:
            error: Any = protocol.error_for(answer)
            if getattr(error, "slug", None) == "no-fleet":
                return None
            raise error
        return protocol.parse(protocol.check(answer), FleetView.from_json)

    def delete_fleet(self, fleet: str) -> None:
        """Ends ``fleet``: every grant it made is released before it returns (the members'
        sessions stay). Idempotent."""
        self._timed(protocol.Call("DELETE", protocol.fleet_path(fleet)))

    def drain_member(self, fleet: str, member: str) -> str:
        """Drains ``member`` as an operator: it hands everything off and is given nothing new.
        Its state after the call (``draining``, or ``evicted`` for an evicted member)."""
        answer = self._timed(protocol.drain_call(fleet, member, None))[1]
        return protocol.parse(answer, lambda body: str(body["state"]))

    def evict_member(self, fleet: str, member: str) -> None:
        """Evicts ``member`` (an operator): its grants of the fleet end at once, and it is given
        nothing until it joins again."""
        self._timed(protocol.Call("DELETE", protocol.member_path(fleet, member)))
