"""The loss watch of the sync client: one ``GET /v1/watch`` stream per client, over the resources
its guards hold, so that a guard learns of its loss when the proxy sees it (a revoked or expired
etcd lease, a release by someone else, a later grant) instead of at its next renewal. Renewals
stay the fallback: when the stream cannot be opened (no ``read`` permission on the resources,
say), they still find every loss.

The shape, as in every SDK (the asyncio twin is ``aio_loss_watch.py``, Rust's ``loss_watch.rs``):

- one stream per client, opened when a guard registers a grant, closed once nothing has been
  held for :data:`LINGER` seconds; its prefix is the longest one every held resource starts with;
- it reads after the smallest token of the grants it must cover (a bare revision as
  ``Last-Event-ID``: nothing of theirs is missed), then resumes after the last id it saw; a grant
  it does not cover (another prefix, an older token) reopens it from the earlier point;
- events are matched by resource and token (``losses.py``); a grant registered after its end was
  read is lost at once (recent events are kept);
- transient failures reconnect with a backoff (0.2 s doubling to 2 s); a resume point compacted
  away reopens the stream from now (renewals cover the gap); a refusal (401, 403, …) stops it for
  :data:`REFUSED_PAUSE` seconds.

Here a stream is read by a thread, which cannot be interrupted in a read: a reopened stream is a
new thread, and the one it replaces stops at its next message or keepalive (15 s at most).
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, List, Optional, Tuple

import httpx

from . import protocol
from .errors import Compacted, LeaseProxyError, TransportError
from .losses import Book, Coverage, earliest, revision, tell
from .models import Event
from .sse import Watch

if TYPE_CHECKING:
    from .client import Client
    from .liveness import Liveness

#: Seconds the stream stays open once nothing is held.
LINGER = 10.0
#: Seconds a refused stream is not tried again.
REFUSED_PAUSE = 60.0


class LossWatch:
    """A sync client's loss watch (see the module doc)."""

    def __init__(self, client: "Client", enabled: bool) -> None:
        self._client = client
        self._enabled = enabled
        self._lock = threading.Lock()
        self._book: Book["Liveness"] = Book()
        # Each stream's thread has a generation; only the current one's may read on.
        self._generation = 0
        self._running = False
        self._refused_until = 0.0
        self._last: Optional[str] = None
        self._empty_since: Optional[float] = None

    def register(self, resource: str, token: int, liveness: "Liveness") -> Optional[int]:
        """Watches the grant of ``resource`` with ``token`` for ``liveness``'s guard until
        :meth:`deregister`; None when disabled, or when an event already read ended it (then
        ``liveness`` is lost now)."""
        if not self._enabled or liveness.reason is not None:
            return None
        with self._lock:
            grant_id, ended = self._book.register(resource, token, liveness)
            if ended is None:
                start = (not self._running and time.monotonic() >= self._refused_until) or (
                    self._running and self._book.uncovered is not None
                )
                if start:
                    self._start()
        if ended is not None:
            tell(liveness, ended)
            return None
        return grant_id

    def deregister(self, grant_id: Optional[int]) -> None:
        """Forgets a registered grant (idempotent)."""
        if grant_id is not None:
            with self._lock:
                self._book.deregister(grant_id)

    def close(self) -> None:
        """Stops the stream (the client is closing)."""
        with self._lock:
            self._enabled = False
            self._generation += 1
            self._running = False

    def _start(self) -> None:
        """Starts a stream's thread, the previous one to stop (called with the lock held)."""
        self._generation += 1
        self._running = True
        self._empty_since = None
        generation = self._generation
        threading.Thread(target=self._run, args=(generation,), name="lease loss watch", daemon=True).start()

    def _run(self, generation: int) -> None:
        with self._lock:
            wanted = self._book.wanted()
            if generation != self._generation or wanted is None:
                if generation == self._generation:
                    self._running = False
                return
            prefix = wanted[0]
            resume = earliest(self._last, self._book.uncovered)
            self._book.uncovered = None
            self._book.coverage = Coverage(prefix, None if resume is None else revision(resume))
        watch = Watch(resume)
        attempt = 0
        while True:
            try:
                if not self._stream(generation, prefix, watch):
                    return
            except Compacted:
                watch = Watch(None)  # from now: the renewals cover the gap
                with self._lock:
                    self._last = None
                    if self._book.coverage is not None:
                        self._book.coverage.after = None
            except LeaseProxyError:
                with self._lock:
                    if generation == self._generation:
                        self._refused_until = time.monotonic() + REFUSED_PAUSE
                        self._running = False
                        self._book.coverage = None
                return
            except (httpx.TransportError, TransportError):
                pass
            except Exception:  # the client closed under it: renewals alone tell from here
                return
            if watch.delivered:
                attempt = 0
            time.sleep(protocol.watch_backoff(attempt))
            attempt += 1
            with self._lock:
                if generation != self._generation:
                    return

    def _stream(self, generation: int, prefix: str, watch: Watch) -> bool:
        """One connection: tells the losses it reads; False once this thread must stop. Raises
        the answer's error when it is not a stream (transient ones are retried by the caller)."""
        watch.connecting()
        with self._client._http.stream(
            "GET",
            "/v1/watch",
            params={"prefix": prefix} if prefix else {},
            headers=protocol.watch_headers(watch.last_event_id),
            timeout=httpx.Timeout(self._client.timeout, read=60.0),
        ) as response:
            if not response.is_success:
                body = protocol.BodyReader(response, time.monotonic() + self._client.timeout, "watch")
                for chunk in response.iter_bytes():
                    body.feed(chunk)
                error = protocol.error_for(body.answer())
                if protocol.is_transient(error):
                    return True
                raise error
            for chunk in response.iter_bytes():
                events = [item for item in watch.feed(chunk) if isinstance(item, Event)]
                lost, go_on = self._took(generation, watch.last_event_id, events)
                for liveness, how in lost:
                    tell(liveness, how)
                if not go_on:
                    return False
                if watch.broken:
                    return True
        return True

    def _took(
        self, generation: int, last: Optional[str], events: List[Event]
    ) -> Tuple[List[Tuple["Liveness", str]], bool]:
        """Books what a chunk brought: the losses to tell, and whether to read on."""
        with self._lock:
            if generation != self._generation:
                return [], False
            self._last = last
            coverage = self._book.coverage
            if coverage is not None and coverage.after is None and last is not None:
                coverage.after = revision(last)
            lost = [told for e in events for told in self._book.see(e.resource, e.type, e.token)]
            if not self._book.is_empty():
                self._empty_since = None
            elif self._empty_since is None:
                self._empty_since = time.monotonic()
            elif time.monotonic() - self._empty_since >= LINGER:
                self._running = False
                self._book.coverage = None
                self._generation += 1
                return lost, False
            return lost, True

