"""Client for lease-proxy: exclusive leases on named resources, with fencing tokens.

Sync::

    from lease_proxy_client import Client

    client = Client("http://127.0.0.1:7070")
    with client.lease("aisle-1", ttl=20, holder="robot-1") as lease:
        while not lease.lost.is_set():
            lease.forward("PUT", "aisles/aisle-1/count", json={"robot": "robot-1", "count": 3})

asyncio: :class:`AsyncClient`, the same calls awaited (``async with client.lease(...)``).
"""

from .aio import AsyncClient, AsyncEventStream, AsyncLease, AsyncSession
from .client import Client, EventStream, Lease, Session
from .errors import (
    Compacted,
    Held,
    InjectedRefusal,
    LeaseProxyError,
    Lost,
    Problem,
    ProtocolError,
    SessionLost,
    TransportError,
)
from .fleet import AssignmentChange, Member, Releasing
from .models import Event, FleetMember, FleetView, Grant, Holding, Renewal, SessionGrant
from .propagation import FencingAuth, admit, fencing_headers
from .testmode import FakeProxy, TestMode

__all__ = [
    "AssignmentChange",
    "AsyncClient",
    "AsyncEventStream",
    "AsyncLease",
    "AsyncSession",
    "Client",
    "Compacted",
    "Event",
    "FakeProxy",
    "EventStream",
    "FencingAuth",
    "FleetMember",
    "FleetView",
    "Grant",
    "Held",
    "Holding",
    "InjectedRefusal",
    "Lease",
    "LeaseProxyError",
    "Lost",
    "Member",
    "Problem",
    "ProtocolError",
    "Releasing",
    "Renewal",
    "Session",
    "SessionGrant",
    "SessionLost",
    "TestMode",
    "TransportError",
    "admit",
    "fencing_headers",
]
