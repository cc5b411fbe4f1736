"""Server-Sent Events parsing (the WHATWG event-stream format) for ``GET /v1/watch``."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import List, Optional, Union

from .errors import LeaseProxyError, ProtocolError
from .models import Event
from .protocol import Answer, parse

#: The most bytes a line, or the data of one message, may have (as :data:`protocol.MAX_LINE`).
MAX_LINE = 1 << 20
#: The message names that are ownership events.
EVENTS = ("acquired", "released", "expired")
_NEWLINE = re.compile(rb"\r\n|\r|\n")


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
    still taken: that is how the watch's first, id-only message sets the resume point, and how a
    quiet stream's progress messages (id-only too) move it on.
    """

    def __init__(self, last_event_id: Optional[str] = None) -> None:
        #: The id to send as ``Last-Event-ID`` when reconnecting.
        self.last_event_id = last_event_id
        self._event = ""
        self._data: List[str] = []
        self._size = 0
        self._pending_id: Optional[str] = None

    def feed(self, line: str) -> Optional[Message]:
        """Takes one line; returns the message a blank line completes, if any. Raises
        :class:`ProtocolError` when the message's data passes :data:`MAX_LINE`."""
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
            self._size += len(value) + 1
            if self._size > MAX_LINE:
                raise ProtocolError(200, f"event-stream message over {MAX_LINE} bytes")
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
        self._event, self._data, self._size = "", [], 0
        if not data:
            return None
        return Message(event=event, data="\n".join(data), last_event_id=self.last_event_id)


def to_event(message: Message) -> Event:
    """The ownership event a message carries (its id is the id in force); :class:`ProtocolError`
    when it does not parse."""
    answer = Answer(200, "OK", message.data.encode())
    return parse(answer, lambda body: Event.from_json(message.last_event_id or "", body))


class LineReader:
    """Cuts an event stream's bytes into lines (ended by CRLF, LF or CR, decoded as UTF-8);
    raises :class:`ProtocolError` when a line passes :data:`MAX_LINE` bytes."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._after_cr = False

    def feed(self, chunk: bytes) -> List[str]:
        """Takes a chunk; returns the lines it completes."""
        if self._after_cr and chunk[:1] == b"\n":
            chunk = chunk[1:]  # the LF of a CRLF split between two chunks
        self._after_cr = False
        lines: List[str] = []
        start = 0
        for match in _NEWLINE.finditer(chunk):
            self._take(chunk[start : match.start()])
            lines.append(self._buffer.decode("utf-8", "replace"))
            self._buffer = bytearray()
            start = match.end()
            self._after_cr = match.group() == b"\r" and start == len(chunk)
        self._take(chunk[start:])
        return lines

    def _take(self, part: bytes) -> None:
        if len(self._buffer) + len(part) > MAX_LINE:
            raise ProtocolError(200, f"event-stream line over {MAX_LINE} bytes")
        self._buffer += part


#: What a watch yields: an event, or the error of one that does not parse.
Item = Union[Event, LeaseProxyError]


class Watch:
    """The watch's state across connections, without I/O (shared by the sync and asyncio
    streams): the resume point, a fresh line reader and parser for each connection (so a message
    cut by a disconnect is dropped, never completed by the next connection), and whether the
    connection delivered an event (otherwise the next reconnection backs off further)."""

    def __init__(self, last_event_id: Optional[str]) -> None:
        self._parser = Parser(last_event_id)
        self._lines = LineReader()
        #: The current connection delivered an event (or a malformed one).
        self.delivered = False
        #: The current connection sent something over the limits: drop it.
        self.broken = False

    @property
    def last_event_id(self) -> Optional[str]:
        """The id of the last complete message: the resume point."""
        return self._parser.last_event_id

    def connecting(self) -> None:
        """A new connection: whatever the last one left half-read is dropped."""
        self._parser = Parser(self._parser.last_event_id)
        self._lines = LineReader()
        self.delivered = self.broken = False

    def feed(self, chunk: bytes) -> List[Item]:
        """Takes a chunk of the stream; returns the events it completes, a malformed event as its
        :class:`ProtocolError`, and, when a line or message is over the limit, that error last
        (:attr:`broken` is then set: the caller drops the connection and resumes)."""
        items: List[Item] = []
        try:
            for line in self._lines.feed(chunk):
                message = self._parser.feed(line)
                if message is not None and message.event in EVENTS:
                    self.delivered = True
                    try:
                        items.append(to_event(message))
                    except ProtocolError as e:
                        items.append(e)
        except ProtocolError as e:
            self.broken = True
            items.append(e)
        return items
