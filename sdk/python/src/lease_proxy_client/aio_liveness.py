"""The lost signal of the asyncio guards: a deadline on the monotonic clock, a timer on the event
loop that sets the signal when the deadline passes, and a check of the deadline on every look."""

from __future__ import annotations

import asyncio
import time
from typing import List, Optional

from .protocol import EXPIRED, RELEASED, SESSION_LOST


class AsyncLostEvent(asyncio.Event):
    """An :class:`asyncio.Event` set when the lease (or session) is lost.

    Besides being set by the timer at the deadline, ``is_set()`` compares the monotonic clock with
    the deadline itself, so code resumed after a pause sees it set before it acts.
    """

    def __init__(self, liveness: "AsyncLiveness") -> None:
        super().__init__()
        self._liveness = liveness

    def is_set(self) -> bool:
        """True once lost (checked against the deadline right now)."""
        self._liveness.check()
        return super().is_set()

    def _set_lost(self) -> None:
        super().set()


class AsyncLiveness:
    """Deadline and lost signal of one asyncio guard; with a ``parent`` (a lease under a session)
    it lives and is lost with the parent. Must be created inside the event loop."""

    def __init__(self, deadline: float, parent: Optional["AsyncLiveness"] = None) -> None:
        self._deadline = deadline
        self._parent = parent
        self._children: List["AsyncLiveness"] = []
        self._timer: Optional[asyncio.TimerHandle] = None
        self.reason: Optional[str] = None
        #: Whether the test mode caused the loss.
        self.injected = False
        self.lost = AsyncLostEvent(self)
        if parent is not None:
            parent._adopt(self)
        else:
            self._arm()

    @property
    def deadline(self) -> float:
        """The conservative end on :func:`time.monotonic`'s clock."""
        return self._parent.deadline if self._parent is not None else self._deadline

    def extend(self, deadline: float) -> None:
        """Moves the deadline later (after a successful renewal); never earlier, never back to life."""
        if self.reason is None and deadline > self._deadline:
            self._deadline = deadline
            self._arm()

    def check(self) -> None:
        """Declares the guard lost (``expired``) when its deadline has passed."""
        if self.reason is None and time.monotonic() >= self.deadline:
            self.fire(EXPIRED)

    def fire(self, reason: str) -> bool:
        """Marks the guard lost for ``reason`` (the first reason wins); True if this call did."""
        if self.reason is not None:
            return False
        self.reason = reason
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.lost._set_lost()
        children, self._children = self._children, []
        for child in children:
            child.injected = self.injected
            child.fire(RELEASED if reason == RELEASED else SESSION_LOST)
        return True

    def _adopt(self, child: "AsyncLiveness") -> None:
        if self.reason is None:
            self._children.append(child)
        else:
            child.fire(RELEASED if self.reason == RELEASED else SESSION_LOST)

    def _arm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        delay = max(self._deadline - time.monotonic(), 0.0)
        self._timer = asyncio.get_running_loop().call_later(delay, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        if self.reason is None:
            if time.monotonic() >= self._deadline:
                self.fire(EXPIRED)
            else:
                self._arm()
