"""The watch consumer: event-stream parsing, reconnection with ``Last-Event-ID``, and (once
``GET /v1/watch`` is on main) end to end against the proxy."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator, List, Optional

import pytest

from conftest import Etcd
from lease_proxy_client import AsyncClient, Client, Compacted, Event
from lease_proxy_client.sse import Parser, to_event

ACQUIRED = {
    "type": "acquired",
    "resource": "aisle-1",
    "holder": "robot-3",
    "token": "1234",
    "revision": 1234,
    "lease_id": "7587",
    "session": "99",
}


def feed_all(parser: Parser, text: str) -> list:
    messages = []
    for line in text.split("\n"):
        message = parser.feed(line)
        if message is not None:
            messages.append(message)
    return messages


def test_the_id_only_first_message_sets_the_resume_point_without_an_event() -> None:
    parser = Parser()
    assert feed_all(parser, "id: 1200\n\n") == []
    assert parser.last_event_id == "1200"


def test_an_event_carries_its_id_type_and_fields() -> None:
    parser = Parser("1200")
    text = f": keepalive\n\nid: 1234.0\nevent: acquired\ndata: {json.dumps(ACQUIRED)}\n\n"
    [message] = feed_all(parser, text)
    event = to_event(message)
    assert event == Event(
        id="1234.0",
        type="acquired",
        resource="aisle-1",
        holder="robot-3",
        token=1234,
        revision=1234,
        lease_id="7587",
        session="99",
    )
    assert parser.last_event_id == "1234.0"


def test_field_rules_of_the_event_stream_format() -> None:
    parser = Parser("5")
    # no space after the colon, data over several lines, an id with NUL ignored, a comment,
    # a field without a colon, an unknown field
    [message] = feed_all(parser, 'id:6\x00\nevent:released\ndata:{"a":\ndata: 1}\nretry: 10\nodd\n: note\n\n')
    assert message.event == "released" and json.loads(message.data) == {"a": 1}
    assert message.last_event_id == "5" and parser.last_event_id == "5"
    [message] = feed_all(parser, "data: x\n\n")  # no event name: a plain message keeps the id
    assert message.event == "message" and message.last_event_id == "5"
    assert feed_all(parser, "event: expired\n\n") == []  # no data: nothing dispatched


class ScriptedWatch:
    """An HTTP server answering ``GET /v1/watch`` from a script, one entry per connection, and
    recording each connection's ``Last-Event-ID``: the reconnection logic of the consumer, tested
    without the proxy's route (which is not on this branch yet)."""

    def __init__(self, script: List[tuple]) -> None:
        self.seen_ids: List[Optional[str]] = []
        self.seen_queries: List[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                outer.seen_ids.append(self.headers.get("Last-Event-ID"))
                outer.seen_queries.append(self.path)
                status, body = script[min(len(outer.seen_ids), len(script)) - 1]
                self.send_response(status)
                kind = "text/event-stream" if status == 200 else "application/problem+json"
                self.send_header("content-type", kind)
                self.send_header("content-length", str(len(body)))
                self.send_header("connection", "close")
                self.end_headers()
                self.wfile.write(body.encode())

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()


def event_text(id: str, kind: str, token: int) -> str:
    data = dict(ACQUIRED, type=kind, token=str(token), revision=token)
    return f"id: {id}\nevent: {kind}\ndata: {json.dumps(data)}\n\n"


COMPACTED = json.dumps(
    {
        "type": "https://lease-proxy.dev/problems/events-compacted",
        "title": "Events compacted",
        "status": 410,
    }
)
SCRIPT = [
    (200, "id: 10\n\n" + event_text("11", "acquired", 11)),  # then the connection drops
    (
        503,
        json.dumps(
            {"type": "https://lease-proxy.dev/problems/etcd-unavailable", "title": "x", "status": 503}
        ),
    ),
    (200, ": keepalive\n\n" + event_text("12.0", "released", 11) + event_text("12.1", "acquired", 12)),
    (410, COMPACTED),
]


@pytest.fixture
def scripted() -> Iterator[ScriptedWatch]:
    server = ScriptedWatch(SCRIPT)
    yield server
    server.close()


def test_watch_reconnects_resumes_after_the_last_id_and_stops_on_compaction(scripted: ScriptedWatch) -> None:
    with Client(scripted.url) as client:
        stream = client.watch(prefix="aisle-")
        got = []
        with pytest.raises(Compacted):
            for event in stream:
                got.append((event.id, event.type))
    assert got == [("11", "acquired"), ("12.0", "released"), ("12.1", "acquired")]
    # resumed after the last id seen, through the 503, until the 410
    assert scripted.seen_ids == [None, "11", "11", "12.1"]
    assert all(q == "/v1/watch?prefix=aisle-" for q in scripted.seen_queries)
    assert stream.last_event_id == "12.1"


# A quiet stream: id-only messages after the first (progress) move the resume point on
# without an event; a reconnection resumes from the newest id of any message.
PROGRESS_SCRIPT = [
    (200, "id: 10\n\n" + event_text("11", "acquired", 11) + ": keepalive\n\nid: 14\n\n"),
    (200, "id: 14\n\nid: 20\n\n" + event_text("21.0", "released", 11) + "id: 25\n\n"),
    (410, COMPACTED),
]


@pytest.fixture
def progressing() -> Iterator[ScriptedWatch]:
    server = ScriptedWatch(PROGRESS_SCRIPT)
    yield server
    server.close()


def test_progress_ids_move_the_resume_point_and_are_never_events(progressing: ScriptedWatch) -> None:
    with Client(progressing.url) as client:
        stream = client.watch(prefix="aisle-")
        got = []
        with pytest.raises(Compacted):
            for event in stream:
                got.append(event.id)
    assert got == ["11", "21.0"]
    assert progressing.seen_ids == [None, "14", "25"]
    assert stream.last_event_id == "25"


@pytest.mark.asyncio
async def test_async_progress_ids_move_the_resume_point(progressing: ScriptedWatch) -> None:
    async with AsyncClient(progressing.url) as client:
        stream = client.watch()
        got = []
        with pytest.raises(Compacted):
            async for event in stream:
                got.append(event.id)
    assert got == ["11", "21.0"]
    assert progressing.seen_ids == [None, "14", "25"]


@pytest.mark.asyncio
async def test_async_watch_reconnects_and_resumes(scripted: ScriptedWatch) -> None:
    async with AsyncClient(scripted.url) as client:
        stream = client.watch(last_event_id="9")
        got = []
        with pytest.raises(Compacted):
            async for event in stream:
                got.append(event.id)
    assert got == ["11", "12.0", "12.1"]
    assert scripted.seen_ids == ["9", "11", "11", "12.1"]


def test_watch_end_to_end_against_the_proxy(proxy: str, resource: str) -> None:
    with Client(proxy) as client:
        stream = client.watch(prefix=resource)
        events: List[Event] = []
        reader = threading.Thread(target=lambda: events.extend(e for _, e in zip(range(3), stream)))
        reader.start()
        time.sleep(0.5)  # the stream starts after the revision of its first, id-only message
        with client.lease(resource, ttl=10, holder="watched") as lease:
            pass
        with client.lease(resource, ttl=10, holder="again") as second:
            pass
        reader.join(timeout=20)
        assert [(e.type, e.holder, e.token) for e in events] == [
            ("acquired", "watched", lease.token),
            ("released", "watched", lease.token),
            ("acquired", "again", second.token),
        ]
        # resuming after the first event replays the two after it, nothing lost or repeated
        resumed = client.watch(prefix=resource, last_event_id=events[0].id)
        again = [e for _, e in zip(range(2), resumed)]
        assert [e.id for e in again] == [e.id for e in events[1:]]
        resumed.close()
        stream.close()


@pytest.mark.asyncio
async def test_async_watch_end_to_end_against_the_proxy(proxy: str, resource: str) -> None:
    async with AsyncClient(proxy) as client:
        stream = client.watch(prefix=resource)
        first = asyncio.ensure_future(stream.__anext__())
        await asyncio.sleep(0.5)
        async with client.lease(resource, ttl=10, holder="watched") as lease:
            event = await asyncio.wait_for(first, timeout=10)
            assert (event.type, event.resource, event.token) == ("acquired", resource, lease.token)
        await stream.aclose()


def test_a_watch_resuming_from_compacted_history_raises_compacted(
    proxy: str, etcd: Etcd, resource: str
) -> None:
    with Client(proxy) as client:
        with client.lease(resource, ttl=10, holder="gone"):
            pass
        etcd.compact()
        with pytest.raises(Compacted):
            for _ in client.watch(prefix=resource, last_event_id="1"):
                pass


def test_a_quiet_watch_keeps_a_resume_point_that_survives_compaction(
    proxy: str, etcd: Etcd, resource: str
) -> None:
    """Against the proxy: changes under other names move a quiet watch's resume point on (no
    event yielded); after a compaction up to it, resuming from it delivers what came next."""
    with Client(proxy) as client:
        stream = client.watch(prefix=resource)
        events: List[Event] = []
        reader = threading.Thread(target=lambda: events.extend(e for _, e in zip(range(1), stream)))
        reader.start()
        deadline = time.monotonic() + 10
        while stream.last_event_id is None:
            assert time.monotonic() < deadline, "the watch never started"
            time.sleep(0.05)
        first = stream.last_event_id
        with client.lease(f"x{resource}", ttl=10, holder="elsewhere") as other:
            pass
        # the release came after the grant: wait for a resume point past it
        while not (stream.last_event_id or "").isdigit() or int(stream.last_event_id) <= other.token:
            assert time.monotonic() < deadline, f"resume point stayed at {stream.last_event_id} (first {first})"
            time.sleep(0.05)
        assert events == []
        progress = stream.last_event_id
        etcd.compact(int(progress))
        resumed = client.watch(prefix=resource, last_event_id=progress)
        with client.lease(resource, ttl=10, holder="after") as lease:
            pass
        [event] = [e for _, e in zip(range(1), resumed)]
        assert (event.type, event.holder, event.token) == ("acquired", "after", lease.token)
        resumed.close()
        reader.join(timeout=20)  # the first stream sees the same acquire
        stream.close()
        assert [e.id for e in events] == [event.id]
