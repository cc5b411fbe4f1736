"""Server-Sent Events parsing (the WHATWG event-stream format) for ``GET /v1/watch``."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import List, Optional

from .models import Event


@dataclass(frozen=True)
class Message:
    """One dispatched message: its ``event`` name (``message`` when none was given), its data
    lines joined by newlines, and the last event id in force when it was dispatched."""

    event: str
    data: str
    last_event_id: Optional[str]


class Parser:
    """Feeds on lines (without their line ending) and returns the messages they complete.

    Follows the event-stream rules: ``:`` starts a comment, ``field: value`` loses one space after
    the colon, a line without a colon is a field with an empty value, an ``id`` containing NUL is
    ignored, a blank line dispatches. A message with no data is not dispatched, but its ``id`` is
    still taken: that is how the watch's first, id-only message sets the resume point.
    """

    def __init__(self, last_event_id: Optional[str] = None) -> None:
        #: The id to send as ``Last-Event-ID`` when reconnecting.
        self.last_event_id = last_event_id
        self._event = ""
        self._data: List[str] = []
        self._pending_id: Optional[str] = None

    def feed(self, line: str) -> Optional[Message]:
        """Takes one line; returns the message a blank line completes, if any."""
        if line == "":
            return self._dispatch()
        if line.startswith(":"):
            return None
        name, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        elif name == "id":
            if "\0" not in value:
                self._pending_id = value
        return None

    def _dispatch(self) -> Optional[Message]:
        if self._pending_id is not None:
            self.last_event_id = self._pending_id
            self._pending_id = None
        event, data = self._event or "message", self._data
        self._event, self._data = "", []
        if not data:
            return None
        return Message(event=event, data="\n".join(data), last_event_id=self.last_event_id)


def to_event(message: Message) -> Event:
    """The ownership event a message carries (its id is the id in force)."""
    return Event.from_json(message.last_event_id or "", json.loads(message.data))
