"""The loss watch of the asyncio client: the same shape as the sync one (``loss_watch.py``, whose
module doc says it), with one task instead of a thread; a stream that must be reopened (a grant it
does not cover) or closed (nothing held for :data:`~lease_proxy_client.loss_watch.LINGER` s) is
the task cancelled."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Optional

import httpx

from . import protocol
from .errors import Compacted, LeaseProxyError, TransportError
from .loss_watch import LINGER, REFUSED_PAUSE
from .losses import Book, Coverage, earliest, revision, tell
from .models import Event
from .sse import Watch

if TYPE_CHECKING:
    from .aio import AsyncClient
    from .aio_liveness import AsyncLiveness


class AsyncLossWatch:
    """An asyncio client's loss watch. Used from its event loop only."""

    def __init__(self, client: "AsyncClient", enabled: bool) -> None:
        self._client = client
        self._enabled = enabled
        self._book: Book["AsyncLiveness"] = Book()
        self._task: Optional[asyncio.Task] = None
        self._linger: Optional[asyncio.TimerHandle] = None
        self._refused_until = 0.0
        self._last: Optional[str] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None

    def register(self, resource: str, token: int, liveness: "AsyncLiveness") -> Optional[int]:
        """As :meth:`LossWatch.register <lease_proxy_client.loss_watch.LossWatch.register>`."""
        if not self._enabled or liveness.reason is not None:
            return None
        grant_id, ended = self._book.register(resource, token, liveness)
        if ended is not None:
            tell(liveness, ended)
            return None
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None
        loop = self._loop = asyncio.get_running_loop()
        running = self._task is not None and not self._task.done() and self._task.get_loop() is loop
        if running and self._book.uncovered is not None:
            self._stop()
            running = False
        if not running and time.monotonic() >= self._refused_until:
            self._task = loop.create_task(self._run())
        return grant_id

    def deregister(self, grant_id: Optional[int]) -> None:
        """Forgets a registered grant (idempotent); the stream closes :data:`LINGER` s after the
        last one."""
        if grant_id is None:
            return
        self._book.deregister(grant_id)
        if self._book.is_empty() and self._task is not None and self._linger is None:
            try:
                self._linger = self._task.get_loop().call_later(LINGER, self._linger_over)
            except RuntimeError:
                self._task = None  # the loop is closed, and the stream with it

    def deregister_from_gc(self, grant_id: Optional[int]) -> None:
        """:meth:`deregister` from the garbage collector, on whatever thread."""
        if self._loop is None or grant_id is None:
            return
        try:
            self._loop.call_soon_threadsafe(self.deregister, grant_id)
        except RuntimeError:
            self._book.deregister(grant_id)  # the loop is closed: nothing else reads the book

    def close(self) -> None:
        """Stops the stream (the client is closing)."""
        self._enabled = False
        self._stop()

    def _stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None
        self._book.coverage = None

    def _linger_over(self) -> None:
        self._linger = None
        if self._book.is_empty():
            self._stop()

    async def _run(self) -> None:
        wanted = self._book.wanted()
        if wanted is None:
            return
        prefix = wanted[0]
        resume = earliest(self._last, self._book.uncovered)
        self._book.uncovered = None
        self._book.coverage = Coverage(prefix, None if resume is None else revision(resume))
        watch = Watch(resume)
        attempt = 0
        while True:
            try:
                await self._stream(prefix, watch)
            except Compacted:
                watch = Watch(None)  # from now: the renewals cover the gap
                self._last = None
                if self._book.coverage is not None:
                    self._book.coverage.after = None
            except LeaseProxyError:
                self._refused_until = time.monotonic() + REFUSED_PAUSE
                self._book.coverage = None
                return
            except (httpx.TransportError, TransportError):
                pass
            except Exception:  # the client closed under it: renewals alone tell from here
                return
            if watch.delivered:
                attempt = 0
            await asyncio.sleep(protocol.watch_backoff(attempt))
            attempt += 1

    async def _stream(self, prefix: str, watch: Watch) -> None:
        """One connection, telling the losses it reads; raises the answer's error when it is not
        a stream (returns on a transient one: the caller reconnects)."""
        watch.connecting()
        async with self._client._http.stream(
            "GET",
            "/v1/watch",
            params={"prefix": prefix} if prefix else {},
            headers=protocol.watch_headers(watch.last_event_id),
            timeout=httpx.Timeout(self._client.timeout, read=60.0),
        ) as response:
            if not response.is_success:
                body = protocol.BodyReader(response, time.monotonic() + self._client.timeout, "watch")
                async for chunk in response.aiter_bytes():
                    body.feed(chunk)
                error = protocol.error_for(body.answer())
                if protocol.is_transient(error):
                    return
                raise error
            async for chunk in response.aiter_bytes():
                for item in watch.feed(chunk):
                    if isinstance(item, Event):
                        for liveness, how in self._book.see(item.resource, item.type, item.token):
                            tell(liveness, how)
                self._last = watch.last_event_id
                coverage = self._book.coverage
                if coverage is not None and coverage.after is None and self._last is not None:
                    coverage.after = revision(self._last)
                if watch.broken:
                    return
