"""The asyncio client: :class:`AsyncClient`, :class:`AsyncLease` and :class:`AsyncSession`, with
the same semantics as the sync ones (renewal tasks and loop timers instead of threads)."""

from __future__ import annotations

import asyncio
import threading
import time
import weakref
from types import TracebackType
from typing import (
    Any,
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Dict,
    Generator,
    Generic,
    List,
    Mapping,
    Optional,
    Protocol,
    Tuple,
    Type,
    TypeVar,
)


import httpx

from . import protocol
from .aio_liveness import AsyncLiveness, AsyncLostEvent
from .aio_loss_watch import AsyncLossWatch
from .client import USER_AGENT
from .errors import LeaseProxyError, Lost, SessionLost, TransportError
from .models import Event, Grant, Holding, Renewal, SessionGrant
from .protocol import Answer, Cert, EXPIRED, RELEASED, REVOKED, SESSION_LOST, Call, Verify
from .sse import Item, Watch
from .testmode import FAILED_RENEWAL, LATE_RENEWAL, LOSS, TOKEN_REFUSAL, Faults, TestMode, injected_refusal
from .views import LeaseView, SessionView


class AsyncClient:
    """An asyncio connection to lease-proxy; ``async with AsyncClient(...) as client:`` closes it.
    Arguments as :class:`~lease_proxy_client.Client`."""

    def __init__(
        self,
        base_url: str = "http://127.0.0.1:7070",
        *,
        token: Optional[str] = None,
        verify: Verify = True,
        cert: Optional[Cert] = None,
        timeout: float = 10.0,
        user_agent: str = USER_AGENT,
        loss_watch: bool = True,
        safety_margin: Optional[float] = None,
        test_mode: Optional[TestMode] = None,
    ) -> None:
        self.timeout = timeout
        #: Seconds before the server's earliest possible expiry at which a guard counts as lost
        #: (None: a tenth of the lifetime, at least 0.1 s): see :func:`protocol.stop_by`.
        self.safety_margin = safety_margin
        # The test mode's faults (none without one).
        self._faults = Faults(test_mode)
        self._http = httpx.AsyncClient(
            base_url=base_url.rstrip("/"),
            headers=protocol.base_headers(token, user_agent),
            verify=protocol.tls(verify, cert),
            timeout=timeout,
            transport=self._faults.fake,
        )
        # Test hook: while set, guards of this client send no renewal or keepalive (as if the
        # process were paused); the deadline timer runs on.
        self._renewals_paused = threading.Event()
        # One event stream for every guard of this client: a loss is learnt when it happens.
        self._losses = AsyncLossWatch(self, loss_watch)

    async def aclose(self) -> None:
        """Closes the connections (leases still held stay held until released or expired)."""
        self._losses.close()
        await self._http.aclose()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # --- plumbing ---

    async def _send(self, call: Call, timeout: Optional[float] = None) -> Answer:
        """Sends ``call`` and reads the answer (at most ``protocol.MAX_BODY`` bytes), all of it
        within the timeout (an overall deadline, not per read); transport failures and the
        timeout become :class:`TransportError`."""
        limit = (timeout if timeout is not None else self.timeout) + call.extra_timeout
        try:
            return await asyncio.wait_for(self._exchange(call, limit), limit)
        except asyncio.TimeoutError as e:
            raise TransportError(f"{call.method} {call.path}: no whole answer within {limit} s") from e
        except httpx.TransportError as e:
            raise TransportError(f"{call.method} {call.path}: {e!r}") from e

    async def _exchange(self, call: Call, limit: float) -> Answer:
        async with self._http.stream(
            call.method, call.path, headers=call.headers, json=call.json, params=call.params, timeout=limit
        ) as response:
            body = protocol.BodyReader(response, time.monotonic() + limit, f"{call.method} {call.path}")
            async for chunk in response.aiter_bytes():
                body.feed(chunk)
            return body.answer()

    async def _timed(self, call: Call, timeout: Optional[float] = None) -> Tuple[float, Answer]:
        """The monotonic instant read just before sending ``call``, and the checked answer."""
        sent = time.monotonic()
        return sent, protocol.check(await self._send(call, timeout))

    async def _grant(self, call: Call, retry: bool) -> Tuple[float, Grant]:
        attempt = 0
        while True:
            try:
                sent, response = await self._timed(call)
                return sent, protocol.parse(response, Grant.from_json)
            except TransportError:
                if not retry or attempt >= 3:
                    raise
                await asyncio.sleep(protocol.retry_backoff(attempt))
                attempt += 1

    async def _renew_until(self, call: Call, liveness: AsyncLiveness) -> Optional[float]:
        """As :meth:`Client._renew_until <lease_proxy_client.Client>`: retried until success, 410
        (lost) or the deadline; the lifetime granted, or None when lost."""
        attempt = 0
        while liveness.reason is None:
            remaining = liveness.deadline - time.monotonic()
            if remaining <= 0:
                liveness.check()
                return None
            try:
                if self._faults.fires(FAILED_RENEWAL, call.path):
                    raise TransportError(f"{call.method} {call.path}: failed by the test mode")
                sent, response = await self._timed(call, timeout=min(self.timeout, remaining))
                life = protocol.lifetime(*protocol.parse(response, protocol.timing))
            except (Lost, SessionLost):
                liveness.fire(REVOKED)
                return None
            except LeaseProxyError:
                await asyncio.sleep(min(protocol.retry_backoff(attempt), max(remaining, 0.0)))
                attempt += 1
                continue
            if life <= 0:
                liveness.fire(EXPIRED)
                return None
            liveness.extend(protocol.stop_by(sent, life, self.safety_margin))
            return life
        return None

    # --- guards ---

    async def acquire(
        self,
        resource: str,
        *,
        ttl: int,
        holder: str,
        wait: Optional[float] = None,
        idempotency_key: Optional[str] = None,
        metadata: Optional[Mapping[str, Any]] = None,
    ) -> "AsyncLease":
        """Acquires ``resource``; the :class:`AsyncLease` renews itself in a task until released."""
        call = protocol.acquire_call(
            resource, holder=holder, ttl=ttl, wait=wait, idempotency_key=idempotency_key, metadata=metadata
        )
        sent, grant = await self._grant(call, retry=idempotency_key is not None)
        return AsyncLease(self, grant, sent, slack=wait or 0.0)

    def lease(
        self,
        resource: str,
        *,
        ttl: int,
        holder: str,
        wait: Optional[float] = None,
        idempotency_key: Optional[str] = None,
        metadata: Optional[Mapping[str, Any]] = None,
    ) -> "_Acquiring[AsyncLease]":
        """:meth:`acquire` for ``async with client.lease(...) as lease:`` (released on exit)."""
        return _Acquiring(
            self.acquire(
                resource,
                ttl=ttl,
                holder=holder,
                wait=wait,
                idempotency_key=idempotency_key,
                metadata=metadata,
            )
        )

    async def open_session(self, *, holder: str, ttl: int) -> "AsyncSession":
        """Opens a session (one heartbeat task for many leases)."""
        sent, response = await self._timed(protocol.open_session_call(holder, ttl))
        return AsyncSession(self, protocol.parse(response, SessionGrant.from_json), sent)

    def session(self, *, holder: str, ttl: int) -> "_Acquiring[AsyncSession]":
        """:meth:`open_session` for ``async with client.session(...) as s:`` (closed on exit)."""
        return _Acquiring(self.open_session(holder=holder, ttl=ttl))

    # --- one-shots ---

    async def grant(
        self,
        resource: str,
        *,
        ttl: int,
        holder: str,
        wait: Optional[float] = None,
        idempotency_key: Optional[str] = None,
        metadata: Optional[Mapping[str, Any]] = None,
    ) -> Grant:
        """One acquire, nothing renewed."""
        call = protocol.acquire_call(
            resource, holder=holder, ttl=ttl, wait=wait, idempotency_key=idempotency_key, metadata=metadata
        )
        return (await self._grant(call, retry=idempotency_key is not None))[1]

    async def renew(self, resource: str, secret: str) -> Renewal:
        """One renewal; raises :class:`~lease_proxy_client.Lost` once the grant has ended."""
        return protocol.parse((await self._timed(protocol.renew_call(resource, secret)))[1], Renewal.from_json)

    async def release(self, resource: str, secret: str) -> None:
        """Releases a grant (idempotent)."""
        await self._timed(protocol.release_call(resource, secret))

    async def get(self, resource: str) -> Optional[Holding]:
        """Who holds ``resource``, or None when it is free."""
        response = await self._send(protocol.get_call(resource))
        if response.status_code == 404:
            return None
        return protocol.parse(protocol.check(response), Holding.from_json)

    async def list(self, prefix: str = "", *, page_size: Optional[int] = None) -> List[Holding]:
        """Every held resource whose name starts with ``prefix``, in name order (all pages)."""
        holdings: List[Holding] = []
        cursor: Optional[str] = None
        while True:
            answer = (await self._timed(protocol.list_call(prefix, cursor, page_size)))[1]
            page, cursor = protocol.parse(answer, protocol.page)
            holdings.extend(page)
            if not cursor:
                return holdings

    def watch(self, prefix: str = "", last_event_id: Optional[str] = None) -> "AsyncEventStream":
        """Ownership events under ``prefix``, as :meth:`Client.watch <lease_proxy_client.Client.watch>`."""
        return AsyncEventStream(self, prefix, last_event_id)


class _Guard(Protocol):
    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None: ...


G = TypeVar("G", bound=_Guard)


class _Acquiring(Generic[G]):
    """An acquire (or session opening) that is both awaitable and an async context manager
    releasing (closing) what it got on exit."""

    def __init__(self, pending: Awaitable[G]) -> None:
        self._pending = pending
        self._got: Optional[G] = None

    def __await__(self) -> Generator[Any, None, G]:
        return self._pending.__await__()

    async def __aenter__(self) -> G:
        self._got = await self._pending
        return self._got

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        if self._got is not None:
            await self._got.__aexit__(exc_type, exc, tb)


class _AsyncRenewer:
    """The renewal task of a guard: renews at a third of the lifetime (±10 %) until lost or stopped."""

    def __init__(
        self,
        client: AsyncClient,
        call: Call,
        liveness: AsyncLiveness,
        lifetime: float,
        sent: float,
        end: Call,
    ):
        self._client = client
        self._call = call
        self._liveness = liveness
        self._next = sent + protocol.renew_interval(lifetime)
        # For the test mode: its last lifetime, the call that ends its grant, and whether the
        # renewal due now was already made late once.
        self._life, self._end, self._late = lifetime, end, False
        self._task = asyncio.get_running_loop().create_task(self._run())

    def stop(self) -> None:
        """Sends no more renewals (one in flight is cancelled)."""
        self._task.cancel()

    def stop_from_gc(self) -> None:
        """:meth:`stop` from the garbage collector, on whatever thread, the loop perhaps closed."""
        try:
            self._task.get_loop().call_soon_threadsafe(self._task.cancel)
        except RuntimeError:
            pass  # the loop is closed: nothing renews any more

    async def _run(self) -> None:
        while self._liveness.reason is None:
            await asyncio.sleep(max(self._next - time.monotonic(), 0.0))
            if self._client._renewals_paused.is_set():
                self._next = time.monotonic() + 0.05
                continue
            if await self._injected():
                return
            sent = time.monotonic()
            try:
                life = await self._client._renew_until(self._call, self._liveness)
                if life is None:
                    return
                self._life = life
                self._next = sent + protocol.renew_interval(life)
            except Exception:  # the client closed under it, an answer that does not parse…
                return  # renew no more: the timer ends the lease at its deadline

    async def _injected(self) -> bool:
        """The test mode's chances at a renewal due, as the sync renewer's."""
        faults = self._client._faults
        if not self._late and faults.fires(LATE_RENEWAL, self._call.path):
            self._late = True
            self._next = time.monotonic() + faults.late_by(self._life)
            return False
        self._late = False
        if not faults.fires(LOSS, self._call.path):
            return False
        # Marked before the release is sent: the client's event stream may tell of the grant's
        # end (and fire the guard) before the release's answer arrives.
        if self._liveness.reason is None:
            self._liveness.injected = True
        try:  # as if refused: the grant has ended at the proxy when its holder learns it
            await self._client._timed(self._end)
        except Exception:  # unreachable, or the client closed under it: it ends at its TTL
            pass
        self._liveness.fire(REVOKED)
        return True


class AsyncLease(LeaseView[AsyncLostEvent]):
    """A held lease renewed by a task until released or lost (see :class:`~lease_proxy_client.Lease`).
    ``async with`` releases it on exit; :attr:`lost` is an :class:`asyncio.Event`."""

    _liveness: AsyncLiveness

    def __init__(
        self,
        client: AsyncClient,
        grant: Grant,
        sent: float,
        session: Optional["AsyncSession"] = None,
        slack: float = 0.0,
    ):
        self._client = client
        self._grant = grant
        self._renewer: Optional[_AsyncRenewer] = None
        if session is None:
            # A grant of no time (TTL <= 0, expires_in_ms < 0) is a lease lost at once.
            life = protocol.lifetime(grant.ttl_seconds, grant.expires_in_ms, slack)
            self._liveness = AsyncLiveness(protocol.stop_by(sent, life, client.safety_margin))
            if life > 0:
                end = protocol.release_call(grant.resource, grant.secret)
                self._renewer = _AsyncRenewer(
                    client, protocol.renew_call(grant.resource, grant.secret), self._liveness, life, sent, end
                )
        else:
            self._liveness = AsyncLiveness(0.0, parent=session._liveness)
        if self._renewer is not None:
            # Dropped without release: renew no more, so the grant ends at its TTL.
            weakref.finalize(self, self._renewer.stop_from_gc)
        # The client's loss watch tells this lease's loss as soon as the proxy sees it.
        self._watched = client._losses.register(grant.resource, grant.token, self._liveness)
        weakref.finalize(self, client._losses.deregister_from_gc, self._watched)
        self._released = False

    async def forward(
        self,
        method: str,
        path: str,
        *,
        content: Optional[bytes] = None,
        json: Any = None,
        headers: Optional[Dict[str, str]] = None,
        params: Optional[Dict[str, str]] = None,
    ) -> httpx.Response:
        """As :meth:`Lease.forward <lease_proxy_client.Lease.forward>`."""
        if self.lost.is_set():
            raise Lost(f"{self.resource}: lease lost ({self.lost_reason})")
        if self._client._faults.fires(TOKEN_REFUSAL, self.resource):
            return injected_refusal(self.resource)  # the test mode's refusal, nothing sent
        sent_headers = dict(headers or {})
        sent_headers[protocol.SECRET_HEADER] = self.secret
        try:
            response = await self._client._http.request(
                method,
                protocol.forward_path(self.resource, path),
                content=content,
                json=json,
                headers=sent_headers,
                params=params,
            )
        except httpx.TransportError as e:
            raise TransportError(f"forward {self.resource}: {e!r}") from e
        if protocol.is_lost_answer(response):
            self._liveness.fire(SESSION_LOST if self.session_id is not None else REVOKED)
            raise protocol.error_for(response)
        return response

    async def release(self) -> None:
        """Stops renewing, marks the lease lost (``released``), then releases it (idempotent)."""
        if self._renewer is not None:
            self._renewer.stop()
        self._liveness.fire(RELEASED)
        self._client._losses.deregister(self._watched)
        if self._released:
            return
        self._released = True
        try:
            await self._client.release(self.resource, self.secret)
        except BaseException:
            self._released = False
            raise

    async def __aenter__(self) -> "AsyncLease":
        return self

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        try:
            await self.release()
        except LeaseProxyError:
            if exc_type is None:
                raise

    def __repr__(self) -> str:
        return (
            f"<AsyncLease {self.resource} token={self.token} holder={self.holder!r} lost={self.lost_reason}>"
        )


class AsyncSession(SessionView[AsyncLostEvent]):
    """A session kept alive by a task (see :class:`~lease_proxy_client.Session`)."""

    _liveness: AsyncLiveness

    def __init__(self, client: AsyncClient, grant: SessionGrant, sent: float):
        self._client = client
        self._grant = grant
        life = protocol.lifetime(grant.ttl_seconds, grant.expires_in_ms)
        self._liveness = AsyncLiveness(protocol.stop_by(sent, life, client.safety_margin))
        end = protocol.close_session_call(grant.session_id, grant.secret)
        self._renewer = _AsyncRenewer(
            client, protocol.keepalive_call(grant.session_id, grant.secret), self._liveness, life, sent, end
        )
        weakref.finalize(self, self._renewer.stop_from_gc)  # dropped without close: it lapses at its TTL
        self._closed = False

    async def acquire(
        self,
        resource: str,
        *,
        holder: Optional[str] = None,
        wait: Optional[float] = None,
        idempotency_key: Optional[str] = None,
        metadata: Optional[Mapping[str, Any]] = None,
    ) -> AsyncLease:
        """Acquires ``resource`` under this session; its lease is lost with the session."""
        if self.lost.is_set():
            raise SessionLost(f"session {self.id}: {self.lost_reason}")
        call = protocol.acquire_call(
            resource,
            holder=holder or self.holder,
            ttl=None,
            wait=wait,
            idempotency_key=idempotency_key,
            metadata=metadata,
            session=self.id,
            session_secret=self.secret,
        )
        try:
            sent, grant = await self._client._grant(call, retry=idempotency_key is not None)
        except SessionLost:
            self._liveness.fire(REVOKED)
            raise
        return AsyncLease(self._client, grant, sent, session=self)

    def lease(
        self,
        resource: str,
        *,
        holder: Optional[str] = None,
        wait: Optional[float] = None,
        idempotency_key: Optional[str] = None,
        metadata: Optional[Mapping[str, Any]] = None,
    ) -> "_Acquiring[AsyncLease]":
        """:meth:`acquire` for ``async with session.lease(...) as lease:``."""
        return _Acquiring(
            self.acquire(
                resource, holder=holder, wait=wait, idempotency_key=idempotency_key, metadata=metadata
            )
        )

    async def close(self) -> None:
        """Stops the heartbeat, then closes the session, ending its leases (idempotent)."""
        self._renewer.stop()
        self._liveness.fire(RELEASED)
        if self._closed:
            return
        self._closed = True
        try:
            await self._client._timed(protocol.close_session_call(self.id, self.secret))
        except BaseException:
            self._closed = False
            raise

    async def __aenter__(self) -> "AsyncSession":
        return self

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        try:
            await self.close()
        except LeaseProxyError:
            if exc_type is None:
                raise

    def __repr__(self) -> str:
        return f"<AsyncSession {self.id} holder={self.holder!r} lost={self.lost_reason}>"


class AsyncEventStream:
    """An async iterator of :class:`~lease_proxy_client.Event` that reconnects and resumes."""

    def __init__(self, client: AsyncClient, prefix: str, last_event_id: Optional[str]):
        self._client = client
        self._prefix = prefix
        self._watch = Watch(last_event_id)
        self._events = self._run()

    @property
    def last_event_id(self) -> Optional[str]:
        """The id to resume after: the newest of any message, progress included (as
        :attr:`EventStream.last_event_id <lease_proxy_client.EventStream>`)."""
        return self._watch.last_event_id

    def __aiter__(self) -> AsyncIterator[Event]:
        return self

    async def __anext__(self) -> Event:
        """As :meth:`EventStream.__next__ <lease_proxy_client.EventStream>`: a malformed event
        raises :class:`~lease_proxy_client.ProtocolError` and the stream carries on after it."""
        item = await self._events.__anext__()
        if isinstance(item, LeaseProxyError):
            raise item
        return item

    async def aclose(self) -> None:
        """Stops the stream."""
        await self._events.aclose()

    async def _run(self) -> AsyncGenerator[Item, None]:
        attempt = 0
        params = {"prefix": self._prefix} if self._prefix else {}
        watch = self._watch
        while True:
            watch.connecting()
            try:
                async with self._client._http.stream(
                    "GET",
                    "/v1/watch",
                    params=params,
                    headers=protocol.watch_headers(watch.last_event_id),
                    timeout=httpx.Timeout(self._client.timeout, read=60.0),
                ) as response:
                    if not response.is_success:
                        body = protocol.BodyReader(response, time.monotonic() + self._client.timeout, "watch")
                        async for chunk in response.aiter_bytes():
                            body.feed(chunk)
                        error = protocol.error_for(body.answer())
                        if not protocol.is_transient(error):
                            raise error
                    else:
                        async for chunk in response.aiter_bytes():
                            for item in watch.feed(chunk):
                                yield item
                            if watch.broken:
                                break  # over the size limit: drop the connection, resume
            except (httpx.TransportError, TransportError):
                pass
            if watch.delivered:
                attempt = 0
            await asyncio.sleep(protocol.watch_backoff(attempt))
            attempt += 1
