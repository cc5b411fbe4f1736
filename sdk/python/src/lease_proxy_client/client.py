"""The synchronous client: :class:`Client`, its lease guard :class:`Lease` and :class:`Session`."""

from __future__ import annotations

import threading
import time
import weakref
from types import TracebackType
from typing import Any, Callable, Dict, Generator, Iterator, List, Mapping, Optional, Tuple, Type

import httpx

from . import protocol
from .errors import Lost, LeaseProxyError, SessionLost, TransportError
from .fleet_calls import FleetCalls
from .liveness import Liveness, LostEvent
from .loss_watch import LossWatch
from .models import Event, Grant, Holding, Renewal, SessionGrant
from .protocol import Answer, Cert, EXPIRED, REVOKED, RELEASED, SESSION_LOST, Call, Verify
from .sse import Item, Watch
from .testmode import FAILED_RENEWAL, LATE_RENEWAL, LOSS, TOKEN_REFUSAL, Faults, TestMode, injected_refusal
from .views import LeaseView, SessionView

USER_AGENT = "lease-proxy-client-python/0.1"


class Client(FleetCalls):
    """A connection to lease-proxy (thread-safe; one per process is plenty).

    ``token`` is the bearer token (with ``--auth-tokens``), ``verify`` ``True`` (system CAs),
    ``False`` or a CA bundle file, ``cert`` a client certificate file or ``(cert, key)`` for mTLS,
    ``timeout`` the seconds each request may take (a waiting acquire gets its wait on top),
    ``safety_margin`` the seconds before the server's earliest possible expiry at which a guard
    counts as lost (default: a tenth of the lifetime granted, at least 0.1 s), ``test_mode``
    faults to inject, and the in-memory proxy to talk to instead of ``base_url``, for an
    application's tests (:class:`~lease_proxy_client.TestMode`; never in production).
    """

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
        self._http = httpx.Client(
            base_url=base_url.rstrip("/"),
            headers=protocol.base_headers(token, user_agent),
            verify=protocol.tls(verify, cert),
            timeout=timeout,
            transport=self._faults.fake,
        )
        # Test hook: while set, guards of this client send no renewal or keepalive (as if the
        # process were paused); the deadline watchdog runs on.
        self._renewals_paused = threading.Event()
        # One event stream for every guard of this client: a loss is learnt when it happens.
        self._losses = LossWatch(self, loss_watch)

    def close(self) -> None:
        """Closes the connections (leases still held stay held until released or expired)."""
        self._losses.close()
        self._http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- plumbing ---

    def _send(self, call: Call, timeout: Optional[float] = None) -> Answer:
        """Sends ``call``; transport failures become :class:`TransportError`; the body is read
        (at most ``protocol.MAX_BODY`` bytes, and not past the timeout: checked at every chunk)."""
        limit = (timeout if timeout is not None else self.timeout) + call.extra_timeout
        deadline = time.monotonic() + limit
        try:
            with self._http.stream(
                call.method, call.path, headers=call.headers, json=call.json, params=call.params, timeout=limit
            ) as response:
                body = protocol.BodyReader(response, deadline, f"{call.method} {call.path}")
                for chunk in response.iter_bytes():
                    body.feed(chunk)
                return body.answer()
        except httpx.TransportError as e:
            raise TransportError(f"{call.method} {call.path}: {e!r}") from e

    def _timed(self, call: Call, timeout: Optional[float] = None) -> Tuple[float, Answer]:
        """Sends ``call`` and returns the monotonic instant read just before sending it, with the
        checked answer: a deadline is that instant plus the answer's ``expires_in_ms``."""
        sent = time.monotonic()
        return sent, protocol.check(self._send(call, timeout))

    # --- guards ---

    def acquire(
        self,
        resource: str,
        *,
        ttl: int,
        holder: str,
        wait: Optional[float] = None,
        idempotency_key: Optional[str] = None,
        metadata: Optional[Mapping[str, Any]] = None,
    ) -> "Lease":
        """Acquires ``resource`` and returns a :class:`Lease` that renews itself until released.

        ``wait`` (seconds) lets the proxy queue the request while someone else holds it; without
        it a held resource raises :class:`~lease_proxy_client.Held` at once. With an
        ``idempotency_key`` a transport failure is retried with the same key (the proxy answers
        the same grant), so a lost answer never leaves an orphan grant.
        """
        call = protocol.acquire_call(
            resource, holder=holder, ttl=ttl, wait=wait, idempotency_key=idempotency_key, metadata=metadata
        )
        sent, grant = self._grant(call, retry=idempotency_key is not None)
        return Lease(self, grant, sent, slack=wait or 0.0)

    def lease(
        self,
        resource: str,
        *,
        ttl: int,
        holder: str,
        wait: Optional[float] = None,
        idempotency_key: Optional[str] = None,
        metadata: Optional[Mapping[str, Any]] = None,
    ) -> "Lease":
        """:meth:`acquire`, to use as ``with client.lease(...) as lease:`` (released on exit)."""
        return self.acquire(
            resource, ttl=ttl, holder=holder, wait=wait, idempotency_key=idempotency_key, metadata=metadata
        )

    def _grant(self, call: Call, retry: bool) -> Tuple[float, Grant]:
        attempt = 0
        while True:
            try:
                sent, response = self._timed(call)
                return sent, protocol.parse(response, Grant.from_json)
            except TransportError:
                if not retry or attempt >= 3:
                    raise
                time.sleep(protocol.retry_backoff(attempt))
                attempt += 1

    def session(self, *, holder: str, ttl: int) -> "Session":
        """Opens a session (one heartbeat for many leases); ``with client.session(...) as s:``
        closes it on exit."""
        sent, response = self._timed(protocol.open_session_call(holder, ttl))
        return Session(self, protocol.parse(response, SessionGrant.from_json), sent)

    open_session = session

    # --- one-shots ---

    def grant(
        self,
        resource: str,
        *,
        ttl: int,
        holder: str,
        wait: Optional[float] = None,
        idempotency_key: Optional[str] = None,
        metadata: Optional[Mapping[str, Any]] = None,
    ) -> Grant:
        """One acquire, nothing renewed: the caller renews (:meth:`renew`) and releases."""
        call = protocol.acquire_call(
            resource, holder=holder, ttl=ttl, wait=wait, idempotency_key=idempotency_key, metadata=metadata
        )
        return self._grant(call, retry=idempotency_key is not None)[1]

    def renew(self, resource: str, secret: str) -> Renewal:
        """One renewal; raises :class:`~lease_proxy_client.Lost` once the grant has ended."""
        return protocol.parse(self._timed(protocol.renew_call(resource, secret))[1], Renewal.from_json)

    def release(self, resource: str, secret: str) -> None:
        """Releases a grant (idempotent: releasing an ended grant is fine)."""
        self._timed(protocol.release_call(resource, secret))

    def get(self, resource: str) -> Optional[Holding]:
        """Who holds ``resource``, or None when it is free."""
        response = self._send(protocol.get_call(resource))
        if response.status_code == 404:
            return None
        return protocol.parse(protocol.check(response), Holding.from_json)

    def list(self, prefix: str = "", *, page_size: Optional[int] = None) -> List[Holding]:
        """Every held resource whose name starts with ``prefix``, in name order (all pages)."""
        holdings: List[Holding] = []
        cursor: Optional[str] = None
        while True:
            page, cursor = protocol.parse(self._timed(protocol.list_call(prefix, cursor, page_size))[1], protocol.page)
            holdings.extend(page)
            if not cursor:
                return holdings

    def watch(self, prefix: str = "", last_event_id: Optional[str] = None) -> "EventStream":
        """Ownership events under ``prefix`` (``GET /v1/watch``), reconnecting and resuming after
        the last event id seen; raises :class:`~lease_proxy_client.Compacted` when the resume
        point is gone (list again, then watch without ``last_event_id``)."""
        return EventStream(self, prefix, last_event_id)

    # --- used by the guards ---

    def _renew_until(self, call: Call, liveness: Liveness) -> Optional[float]:
        """One renewal (of a lease or a session), retried with backoff until it succeeds, the
        answer is 410 (the guard is then lost), or the deadline passes. A success moves the
        deadline to the instant read before sending it plus the lifetime answered
        (:func:`protocol.lifetime`), which is returned; None when the guard is lost (also when
        the answer grants no time: a TTL <= 0 or a negative ``expires_in_ms``)."""
        attempt = 0
        while liveness.reason is None:
            remaining = liveness.deadline - time.monotonic()
            if remaining <= 0:
                liveness.check()
                return None
            try:
                if self._faults.fires(FAILED_RENEWAL, call.path):
                    raise TransportError(f"{call.method} {call.path}: failed by the test mode")
                sent, response = self._timed(call, timeout=min(self.timeout, remaining))
                life = protocol.lifetime(*protocol.parse(response, protocol.timing))
            except (Lost, SessionLost):
                liveness.fire(REVOKED)
                return None
            except LeaseProxyError:
                time.sleep(min(protocol.retry_backoff(attempt), max(remaining, 0.0)))
                attempt += 1
                continue
            if life <= 0:
                liveness.fire(EXPIRED)
                return None
            liveness.extend(protocol.stop_by(sent, life, self.safety_margin))
            return life
        return None


class _Renewer:
    """The background thread of a guard: renews at a third of the lifetime (±10 %), until the
    guard is lost or stopped."""

    def __init__(
        self,
        client: Client,
        call: Call,
        liveness: Liveness,
        lifetime: float,
        sent: float,
        name: str,
        end: Call,
    ):
        self._client = client
        self._call = call
        self._liveness = liveness
        self._stop = threading.Event()
        self._next = sent + protocol.renew_interval(lifetime)
        # For the test mode: its last lifetime, the call that ends its grant, and whether the
        # renewal due now was already made late once.
        self._life, self._end, self._late = lifetime, end, False
        threading.Thread(target=self._run, name=f"renew {name}", daemon=True).start()

    def stop(self) -> None:
        """Sends no more renewals (a request in flight finishes)."""
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.is_set() and self._liveness.reason is None:
            delay = self._next - time.monotonic()
            if delay > 0:
                if self._stop.wait(min(delay, 3600.0)):  # bounded: waits have a maximum
                    return
                continue
            if self._client._renewals_paused.is_set():
                self._next = time.monotonic() + 0.05
                continue
            if self._injected():
                return
            sent = time.monotonic()
            try:
                life = self._client._renew_until(self._call, self._liveness)
                if life is None:
                    return
                self._life = life
                self._next = sent + protocol.renew_interval(life)
            except Exception:  # the client closed under it, an answer that does not parse…
                return  # renew no more: the watchdog ends the lease at its deadline

    def _injected(self) -> bool:
        """The test mode's chances at a renewal due: made late (once), or the guard lost (True:
        renew no more)."""
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
            self._client._timed(self._end)
        except Exception:  # unreachable, or the client closed under it: it ends at its TTL
            pass
        self._liveness.fire(REVOKED)
        return True


class Lease(LeaseView[LostEvent]):
    """A held lease, renewed in the background until released or lost.

    Use it as a context manager (released on exit, even on an exception) or call
    :meth:`release`. Check :attr:`lost` before every action taken as the holder, and present
    :attr:`fencing_token` to the protected storage (or write through :meth:`forward`).
    """

    _liveness: Liveness

    def __init__(
        self,
        client: Client,
        grant: Grant,
        sent: float,
        session: Optional["Session"] = None,
        slack: float = 0.0,
        claim: Optional[Callable[[], bool]] = None,
    ):
        self._client = client
        self._grant = grant
        # A fleet grant's release is sent only when this says so (once for it and its hand-off).
        self._claim = claim
        self._renewer: Optional[_Renewer] = None
        if session is None:
            # A grant of no time (TTL <= 0, expires_in_ms < 0) is a lease lost at once.
            life = protocol.lifetime(grant.ttl_seconds, grant.expires_in_ms, slack)
            self._liveness = Liveness(protocol.stop_by(sent, life, client.safety_margin), grant.resource)
            if life > 0:
                self._renewer = _Renewer(
                    client,
                    protocol.renew_call(grant.resource, grant.secret),
                    self._liveness,
                    life,
                    sent,
                    grant.resource,
                    protocol.release_call(grant.resource, grant.secret),
                )
        else:
            # The session's heartbeat keeps this grant alive; it is lost with the session.
            self._liveness = Liveness(0.0, grant.resource, parent=session._liveness)
        if self._renewer is not None:
            # Dropped without release: renew no more, so the grant ends at its TTL.
            weakref.finalize(self, self._renewer.stop)
        # The client's loss watch tells this lease's loss as soon as the proxy sees it.
        self._watched = client._losses.register(grant.resource, grant.token, self._liveness)
        weakref.finalize(self, client._losses.deregister, self._watched)
        self._release_lock = threading.Lock()
        self._released = False

    def forward(
        self,
        method: str,
        path: str,
        *,
        content: Optional[bytes] = None,
        json: Any = None,
        headers: Optional[Dict[str, str]] = None,
        params: Optional[Dict[str, str]] = None,
    ) -> httpx.Response:
        """Sends a request to the proxy's upstream as the holder (the proxy adds the fencing
        token) and returns the upstream's answer. Raises :class:`~lease_proxy_client.Lost`
        without sending when the lease is lost, or when the proxy answers that it is. Under the
        test mode, a token refusal it injects is answered, without sending, as fence-gateway's
        409 ``stale-fencing-token`` (``injected`` set in the problem)."""
        if self.lost.is_set():
            raise Lost(f"{self.resource}: lease lost ({self.lost_reason})")
        if self._client._faults.fires(TOKEN_REFUSAL, self.resource):
            return injected_refusal(self.resource)  # the test mode's refusal, nothing sent
        sent_headers = dict(headers or {})
        sent_headers[protocol.SECRET_HEADER] = self.secret
        try:
            response = self._client._http.request(
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

    def release(self) -> None:
        """Stops renewing, marks the lease lost (``released``), then releases it in the proxy
        (idempotent)."""
        with self._release_lock:
            if self._renewer is not None:
                self._renewer.stop()
            self._liveness.fire(RELEASED)
            self._client._losses.deregister(self._watched)
            if self._released or (self._claim is not None and not self._claim()):
                self._released = True
                return
            # Sent even when the lease counts as lost here: the deadline is conservative, so the
            # grant may still be alive in etcd, and a release of an ended grant is a no-op.
            self._client.release(self.resource, self.secret)
            self._released = True

    def __enter__(self) -> "Lease":
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        try:
            self.release()
        except LeaseProxyError:
            if exc_type is None:
                raise

    def __repr__(self) -> str:
        return f"<Lease {self.resource} token={self.token} holder={self.holder!r} lost={self.lost_reason}>"


class Session(SessionView[LostEvent]):
    """A session: one heartbeat keeps every lease acquired under it alive; closing it (or its
    lapsing) ends them all. Use it as a context manager or call :meth:`close`."""

    _liveness: Liveness

    def __init__(self, client: Client, grant: SessionGrant, sent: float):
        self._client = client
        self._grant = grant
        life = protocol.lifetime(grant.ttl_seconds, grant.expires_in_ms)
        self._liveness = Liveness(
            protocol.stop_by(sent, life, client.safety_margin), f"session {grant.session_id}"
        )
        self._renewer = _Renewer(
            client,
            protocol.keepalive_call(grant.session_id, grant.secret),
            self._liveness,
            life,
            sent,
            f"session {grant.session_id}",
            protocol.close_session_call(grant.session_id, grant.secret),
        )
        weakref.finalize(self, self._renewer.stop)  # dropped without close: it lapses at its TTL
        self._close_lock = threading.Lock()
        self._closed = False

    def acquire(
        self,
        resource: str,
        *,
        holder: Optional[str] = None,
        wait: Optional[float] = None,
        idempotency_key: Optional[str] = None,
        metadata: Optional[Mapping[str, Any]] = None,
    ) -> Lease:
        """Acquires ``resource`` under this session (``holder`` defaults to the session's); the
        lease lives as long as the session, and its :attr:`Lease.lost` is set when the session is
        lost."""
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
            sent, grant = self._client._grant(call, retry=idempotency_key is not None)
        except SessionLost:
            self._liveness.fire(REVOKED)
            raise
        return Lease(self._client, grant, sent, session=self)

    lease = acquire

    def close(self) -> None:
        """Stops the heartbeat, then closes the session, ending its leases (idempotent)."""
        with self._close_lock:
            self._renewer.stop()
            self._liveness.fire(RELEASED)
            if self._closed:
                return
            self._client._timed(protocol.close_session_call(self.id, self.secret))
            self._closed = True

    def __enter__(self) -> "Session":
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        try:
            self.close()
        except LeaseProxyError:
            if exc_type is None:
                raise

    def __repr__(self) -> str:
        return f"<Session {self.id} holder={self.holder!r} lost={self.lost_reason}>"


class EventStream:
    """An iterator of :class:`~lease_proxy_client.Event`; reconnects after a dropped connection
    and resumes after :attr:`last_event_id`. Close it (or use ``with``) to stop."""

    def __init__(self, client: Client, prefix: str, last_event_id: Optional[str]):
        self._client = client
        self._prefix = prefix
        self._watch = Watch(last_event_id)
        self._events = self._run()
        self._closed = False

    @property
    def last_event_id(self) -> Optional[str]:
        """The id to resume after: the newest of any message — the last event's, the stream's
        starting point, or a quiet stream's progress (id-only messages, never yielded as events),
        so a quiet watch's resume point keeps up with etcd's compaction."""
        return self._watch.last_event_id

    def __iter__(self) -> Iterator[Event]:
        return self

    def __next__(self) -> Event:
        """The next event; raises :class:`~lease_proxy_client.ProtocolError` for an event that
        does not parse, or a line over the size limit (the stream carries on after it: iterate
        again), and ends with :class:`~lease_proxy_client.Compacted` or another non-transient
        error."""
        item = next(self._events)
        if isinstance(item, LeaseProxyError):
            raise item
        return item

    def close(self) -> None:
        """Stops the stream."""
        self._closed = True
        self._events.close()

    def __enter__(self) -> "EventStream":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self) -> Generator[Item, None, None]:
        attempt = 0
        params = {"prefix": self._prefix} if self._prefix else {}
        watch = self._watch
        while not self._closed:
            watch.connecting()
            try:
                with self._client._http.stream(
                    "GET",
                    "/v1/watch",
                    params=params,
                    headers=protocol.watch_headers(watch.last_event_id),
                    # keepalive comments come every 15 s: a silent minute is a dead connection
                    timeout=httpx.Timeout(self._client.timeout, read=60.0),
                ) as response:
                    if not response.is_success:
                        body = protocol.BodyReader(response, time.monotonic() + self._client.timeout, "watch")
                        for chunk in response.iter_bytes():
                            body.feed(chunk)
                        error = protocol.error_for(body.answer())
                        if not protocol.is_transient(error):
                            raise error
                    else:
                        for chunk in response.iter_bytes():
                            yield from watch.feed(chunk)
                            if watch.broken:
                                break  # over the size limit: drop the connection, resume
            except (httpx.TransportError, TransportError):
                pass
            if watch.delivered:
                attempt = 0
            time.sleep(protocol.watch_backoff(attempt))
            attempt += 1
