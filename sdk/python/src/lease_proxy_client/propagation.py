"""Fencing tokens carried to the storage without code of the application's own: an httpx ``auth``
that puts a lease's ``Fencing-Token`` and ``Fencing-Resource`` on every request it sends (sync
and asyncio httpx alike, e.g. to fence-gateway), and :func:`admit`, which runs
``SELECT fencing.admit(resource, token)`` in the caller's PostgreSQL transaction (the in-database
package, docs/POSTGRES.md). Neither sends anything for a lease known lost."""

from __future__ import annotations

from typing import Any, Dict, Generator

import httpx

from .errors import InjectedRefusal, Lost
from .testmode import TOKEN_REFUSAL
from .views import LeaseView

FENCING_TOKEN = "Fencing-Token"
FENCING_RESOURCE = "Fencing-Resource"
#: The older spelling, which fence-gateway also reads: dropped, since two tokens are refused.
X_FENCING_TOKEN = "X-Fencing-Token"
ADMIT_SQL = "SELECT fencing.admit(%s, %s)"


def fencing_headers(lease: LeaseView[Any]) -> Dict[str, str]:
    """``Fencing-Token`` and ``Fencing-Resource`` of ``lease``; raises
    :class:`~lease_proxy_client.Lost` when it is lost (its deadline read from the clock)."""
    if lease.lost.is_set():
        raise Lost(f"{lease.resource}: lease lost ({lease.lost_reason})")
    return {FENCING_TOKEN: lease.fencing_token, FENCING_RESOURCE: lease.resource}


class FencingAuth(httpx.Auth):
    """``auth=FencingAuth(lease)`` on an httpx request or client (``httpx.Client``,
    ``httpx.AsyncClient``): each request carries the lease's token and resource, any
    ``X-Fencing-Token`` it had is dropped, and a request made once the lease is lost raises
    :class:`~lease_proxy_client.Lost` without being sent."""

    def __init__(self, lease: LeaseView[Any]) -> None:
        self._lease = lease

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        headers = fencing_headers(self._lease)
        request.headers.pop(X_FENCING_TOKEN, None)
        request.headers.update(headers)
        yield request


def admit(target: Any, lease: LeaseView[Any]) -> str:
    """Runs ``SELECT fencing.admit(resource, token)`` for ``lease`` through ``target`` — a
    psycopg connection or cursor (any DB-API cursor with ``%s`` parameters) inside the caller's
    transaction — and returns what it answers (``era:revision``): the transaction's writes then
    commit only if no newer token was admitted for the resource. A stale token raises the
    driver's error with SQLSTATE 23F01 (psycopg: ``e.sqlstate``). A lost lease raises
    :class:`~lease_proxy_client.Lost` without a query. Under the client's test mode, a token
    refusal it injects raises :class:`~lease_proxy_client.InjectedRefusal` (``sqlstate``
    ``23F01``) without a query."""
    headers = fencing_headers(lease)
    faults = getattr(getattr(lease, "_client", None), "_faults", None)
    if faults is not None and faults.fires(TOKEN_REFUSAL, lease.resource):
        raise InjectedRefusal(f"injected by the client's test mode: a newer holder of {lease.resource} has written")
    cursor = target if hasattr(target, "fetchone") else target.cursor()
    cursor.execute(ADMIT_SQL, (headers[FENCING_RESOURCE], headers[FENCING_TOKEN]))
    row = cursor.fetchone()
    return str(row[0])
