"""The lost signal of the sync guards: a deadline on the monotonic clock, a watchdog thread that
sets the signal when the deadline passes, and a check of the deadline on every look at it."""

from __future__ import annotations

import threading
import time
from typing import List, Optional

from .protocol import EXPIRED, RELEASED, SESSION_LOST


class LostEvent(threading.Event):
    """A :class:`threading.Event` set when the lease (or session) is lost.

    Besides being set by the watchdog at the deadline, ``is_set()`` compares the monotonic clock
    with the deadline itself: a process resumed after a pause (SIGSTOP, a long GC, a suspended VM)
    sees it set before it does anything else, even if the watchdog thread has not run yet.
    """

    def __init__(self, liveness: "Liveness") -> None:
        super().__init__()
        self._liveness = liveness

    def is_set(self) -> bool:
        """True once lost (checked against the deadline right now)."""
        self._liveness.check()
        return super().is_set()

    def _set_lost(self) -> None:
        super().set()


class Liveness:
    """Deadline and lost signal of one guard.

    A guard with a ``parent`` (a lease under a session) has no deadline of its own: it lives as
    long as its parent, is lost with the parent (``session-lost``, or ``released`` when the
    session is closed) and can also be lost alone (released).
    """

    def __init__(self, deadline: float, name: str, parent: Optional["Liveness"] = None) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._deadline = deadline
        self._parent = parent
        self._children: List["Liveness"] = []
        self.reason: Optional[str] = None
        #: Whether the test mode caused the loss.
        self.injected = False
        self.lost = LostEvent(self)
        if parent is not None:
            parent._adopt(self)
        else:
            threading.Thread(target=self._watch, name=f"lost-watchdog {name}", daemon=True).start()

    @property
    def deadline(self) -> float:
        """The conservative end of the lease on :func:`time.monotonic`'s clock."""
        if self._parent is not None:
            return self._parent.deadline
        with self._cond:
            return self._deadline

    def extend(self, deadline: float) -> None:
        """Moves the deadline later (after a successful renewal); never earlier, never back to life."""
        with self._cond:
            if self.reason is None and deadline > self._deadline:
                self._deadline = deadline
                self._cond.notify_all()

    def check(self) -> None:
        """Declares the guard lost (``expired``) when its deadline has passed."""
        if self.reason is None and time.monotonic() >= self.deadline:
            self.fire(EXPIRED)

    def fire(self, reason: str) -> bool:
        """Marks the guard lost for ``reason`` (the first reason wins); True if this call did."""
        with self._cond:
            if self.reason is not None:
                return False
            self.reason = reason
            children, self._children = self._children, []
            self._cond.notify_all()
        self.lost._set_lost()
        for child in children:
            child.injected = self.injected
            child.fire(RELEASED if reason == RELEASED else SESSION_LOST)
        return True

    def _adopt(self, child: "Liveness") -> None:
        with self._cond:
            if self.reason is None:
                self._children.append(child)
                return
            reason = self.reason
        child.fire(RELEASED if reason == RELEASED else SESSION_LOST)

    def _watch(self) -> None:
        with self._cond:
            while self.reason is None:
                remaining = self._deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(min(remaining, 3600.0))  # waits have a maximum
        self.fire(EXPIRED)
