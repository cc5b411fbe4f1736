"""The client against a hostile or broken proxy (tests/fakes.py): malformed answers are
ProtocolErrors, absurd lifetimes never make a deadline in the future, timeouts hold against a
server that drips its answer, sizes are bounded, and the watch neither repeats a cut message nor
reconnects in a storm."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from typing import Any, Callable, Dict, Iterator, List

import pytest

from fakes import GRANT, SSE_HEAD, FakeServer, Scenario, answer, drip, grant, sends, sse_event
from lease_proxy_client import AsyncClient, Client, Event, LeaseProxyError, ProtocolError, TransportError
from lease_proxy_client import protocol
from lease_proxy_client.sse import MAX_LINE, Parser


@pytest.fixture
def fake() -> Iterator[Callable[[Scenario], FakeServer]]:
    servers: List[FakeServer] = []

    def make(scenario: Scenario) -> FakeServer:
        servers.append(FakeServer(scenario))
        return servers[-1]

    yield make
    for server in servers:
        server.close()


def by_path(acquire: bytes, renew: bytes, other: bytes = b"") -> Scenario:
    """Answers ``/renew`` with ``renew``, any other request with ``other`` (``acquire`` for the
    first request)."""

    def scenario(conn: socket.socket, method: str, path: str, headers: Dict[str, str], n: int) -> None:
        conn.sendall(renew if path.endswith("/renew") else acquire if n == 1 else other or acquire)

    return scenario


def collect(stream: Any, n: int, within: float = 10.0) -> List[Any]:
    """Up to ``n`` items of a sync event stream (an SDK error counts as an item and the stream is
    read on; another exception ends it), read on a thread for at most ``within`` seconds."""
    got: List[Any] = []

    def run() -> None:
        while len(got) < n:
            try:
                got.append(next(stream))
            except StopIteration:
                return
            except Exception as e:  # noqa: BLE001 - what the stream raises is the point
                got.append(e)
                if not isinstance(e, LeaseProxyError):
                    return

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(within)
    return list(got)


async def acollect(stream: Any, n: int, within: float = 10.0) -> List[Any]:
    got: List[Any] = []

    async def run() -> None:
        while len(got) < n:
            try:
                got.append(await stream.__anext__())
            except StopAsyncIteration:
                return
            except Exception as e:  # noqa: BLE001
                got.append(e)
                if not isinstance(e, LeaseProxyError):
                    return

    try:
        await asyncio.wait_for(run(), within)
    except asyncio.TimeoutError:
        pass
    return list(got)


def ids(items: List[Any]) -> List[str]:
    return [item.id if isinstance(item, Event) else type(item).__name__ for item in items]


# --- 1. a message cut by a disconnect is dropped, not completed by the next connection ---


def cut_then_whole(conn: socket.socket, method: str, path: str, headers: Dict[str, str], n: int) -> None:
    if n == 1:
        # the event's data line arrives, its blank line never does
        conn.sendall(SSE_HEAD + b"id: 1\n\n" + sse_event("2.0").encode()[:-1])
        time.sleep(0.3)
        return
    conn.sendall(SSE_HEAD + b"id: 1\n\n" + (sse_event("2.0") + sse_event("3.0", token=3)).encode())
    time.sleep(30)


def test_watch_drops_a_message_cut_by_a_disconnect(fake: Callable[[Scenario], FakeServer]) -> None:
    server = fake(cut_then_whole)
    with Client(server.url, timeout=5) as client:
        stream = client.watch()
        assert ids(collect(stream, 2)) == ["2.0", "3.0"]
    assert [h.get("last-event-id") for _, _, h in server.requests] == [None, "1"]


@pytest.mark.asyncio
async def test_async_watch_drops_a_message_cut_by_a_disconnect(fake: Callable[[Scenario], FakeServer]) -> None:
    server = fake(cut_then_whole)
    async with AsyncClient(server.url, timeout=5) as client:
        stream = client.watch()
        assert ids(await acollect(stream, 2)) == ["2.0", "3.0"]
        await stream.aclose()


# --- 2. malformed answers are ProtocolErrors ---

HELD = "https://lease-proxy.dev/problems/lease-held"
MALFORMED = {
    "not json": answer(201, "{not json"),
    "html": answer(201, "<html>hi</html>", "text/html"),
    "a list": answer(201, "[1,2,3]"),
    "fields missing": answer(201, json.dumps({"resource": "r"})),
    "token not a number": grant(token="abc"),
    "null token": grant(token=None),
    "null holder": grant(holder=None),
    "Infinity": answer(201, json.dumps(GRANT).replace('"expires_in_ms": 3000', '"expires_in_ms": Infinity')),
    "NaN": answer(201, json.dumps(GRANT).replace('"expires_in_ms": 3000', '"expires_in_ms": NaN')),
    "held, token not a number": answer(
        409, json.dumps({"type": HELD, "holder": "x", "token": "zz", "expires_in_ms": 5}), "application/problem+json"
    ),
    "held, null fields": answer(
        409, json.dumps({"type": HELD, "holder": None, "token": None, "expires_in_ms": None}), "application/problem+json"
    ),
    "deeply nested": answer(201, "[" * 100000),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_acquire_answer_is_a_protocol_error(fake: Callable[[Scenario], FakeServer], case: str) -> None:
    server = fake(sends(MALFORMED[case]))
    with Client(server.url, timeout=5) as client:
        with pytest.raises(ProtocolError) as raised:
            client.acquire("r", ttl=3, holder="h")
    assert raised.value.status in (201, 409) and raised.value.problem


@pytest.mark.asyncio
@pytest.mark.parametrize("case", sorted(MALFORMED))
async def test_a_malformed_acquire_answer_is_a_protocol_error_async(
    fake: Callable[[Scenario], FakeServer], case: str
) -> None:
    server = fake(sends(MALFORMED[case]))
    async with AsyncClient(server.url, timeout=5) as client:
        with pytest.raises(ProtocolError):
            await client.acquire("r", ttl=3, holder="h")


def test_malformed_reads_and_renewals_are_protocol_errors(fake: Callable[[Scenario], FakeServer]) -> None:
    with Client(fake(sends(answer(200, "[1]"))).url, timeout=5) as client:
        with pytest.raises(ProtocolError):
            client.get("r")
        with pytest.raises(ProtocolError):
            client.renew("r", "s")
    with Client(fake(sends(answer(200, '{"leases": 5}'))).url, timeout=5) as client:
        with pytest.raises(ProtocolError):
            client.list()
    with Client(fake(sends(answer(200, '{"leases": [{"resource": null}]}'))).url, timeout=5) as client:
        with pytest.raises(ProtocolError):
            client.list()


BAD_EVENTS = (
    "id: 1\n\n"
    'id: 2.0\nevent: acquired\ndata: {"type":"stolen"}\n\n'
    "id: 3.0\nevent: acquired\ndata: not json\n\n" + sse_event("4.0", token=4)
).encode()


def test_a_malformed_watch_event_is_an_error_and_the_stream_carries_on(
    fake: Callable[[Scenario], FakeServer],
) -> None:
    server = fake(sends(SSE_HEAD + BAD_EVENTS, then_sleep=30))
    with Client(server.url, timeout=5) as client:
        stream = client.watch()
        assert ids(collect(stream, 3)) == ["ProtocolError", "ProtocolError", "4.0"]
        assert stream.last_event_id == "4.0"


@pytest.mark.asyncio
async def test_a_malformed_watch_event_is_an_error_and_the_stream_carries_on_async(
    fake: Callable[[Scenario], FakeServer],
) -> None:
    server = fake(sends(SSE_HEAD + BAD_EVENTS, then_sleep=30))
    async with AsyncClient(server.url, timeout=5) as client:
        stream = client.watch()
        assert ids(await acollect(stream, 3)) == ["ProtocolError", "ProtocolError", "4.0"]
        await stream.aclose()


# --- 3 and 4. absurd lifetimes: clamped to the TTL, or the lease is lost; renewals paced ---

HUGE = {
    "10^15": grant(expires_in_ms=10**15),
    "2^64-1": grant(expires_in_ms=2**64 - 1),
    "10^400": answer(201, json.dumps(GRANT).replace('"expires_in_ms": 3000', '"expires_in_ms": 1' + "0" * 400)),
}
RENEWED = answer(200, json.dumps({"ttl_seconds": 3, "expires_in_ms": 3000, "token": "5"}))


@pytest.fixture
def thread_errors(monkeypatch: pytest.MonkeyPatch) -> List[BaseException]:
    errors: List[BaseException] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: errors.append(args.exc_value))
    return errors


@pytest.mark.parametrize("case", sorted(HUGE))
def test_a_huge_expiry_is_clamped_to_the_ttl(
    fake: Callable[[Scenario], FakeServer], thread_errors: List[BaseException], case: str
) -> None:
    server = fake(by_path(HUGE[case], RENEWED, answer(200, "{}")))
    with Client(server.url, timeout=5) as client:
        lease = client.acquire("r", ttl=3, holder="h")
        assert lease.deadline - time.monotonic() <= 3.0
        time.sleep(0.3)
        assert not lease.lost.is_set()
        lease.release()
    assert thread_errors == []  # the watchdog did not die


@pytest.mark.asyncio
@pytest.mark.parametrize("case", sorted(HUGE))
async def test_a_huge_expiry_is_clamped_to_the_ttl_async(fake: Callable[[Scenario], FakeServer], case: str) -> None:
    server = fake(by_path(HUGE[case], RENEWED, answer(200, "{}")))
    async with AsyncClient(server.url, timeout=5) as client:
        lease = await client.acquire("r", ttl=3, holder="h")
        assert lease.deadline - time.monotonic() <= 3.0
        await lease.release()


NONSENSE = {"ttl 0": grant(ttl_seconds=0), "negative expiry": grant(expires_in_ms=-5000)}


@pytest.mark.parametrize("case", sorted(NONSENSE))
def test_an_acquire_granting_no_time_is_a_lost_lease_and_is_not_renewed(
    fake: Callable[[Scenario], FakeServer], case: str
) -> None:
    server = fake(by_path(NONSENSE[case], RENEWED, answer(200, "{}")))
    with Client(server.url, timeout=5) as client:
        lease = client.acquire("r", ttl=3, holder="h")
        assert lease.lost.is_set() and lease.lost_reason == "expired"
        time.sleep(0.5)
        assert server.count("/renew") == 0
        lease.release()


@pytest.mark.asyncio
@pytest.mark.parametrize("case", sorted(NONSENSE))
async def test_an_acquire_granting_no_time_is_a_lost_lease_async(
    fake: Callable[[Scenario], FakeServer], case: str
) -> None:
    server = fake(by_path(NONSENSE[case], RENEWED, answer(200, "{}")))
    async with AsyncClient(server.url, timeout=5) as client:
        lease = await client.acquire("r", ttl=3, holder="h")
        assert lease.lost.is_set() and lease.lost_reason == "expired"
        await asyncio.sleep(0.5)
        assert server.count("/renew") == 0


NONSENSE_RENEWALS = {
    "ttl 0": answer(200, json.dumps({"ttl_seconds": 0, "expires_in_ms": 3000, "token": "5"})),
    "negative expiry": answer(200, json.dumps({"ttl_seconds": 3, "expires_in_ms": -1, "token": "5"})),
}


@pytest.mark.parametrize("case", sorted(NONSENSE_RENEWALS))
def test_a_renewal_granting_no_time_loses_the_lease(fake: Callable[[Scenario], FakeServer], case: str) -> None:
    server = fake(by_path(grant(), NONSENSE_RENEWALS[case], answer(200, "{}")))
    with Client(server.url, timeout=5) as client:
        lease = client.acquire("r", ttl=3, holder="h")
        # the first renewal comes at about 1 s; the deadline would be 3 s
        assert lease.lost.wait(2.2) and lease.lost_reason == "expired"
        assert server.count("/renew") <= 3


@pytest.mark.asyncio
@pytest.mark.parametrize("case", sorted(NONSENSE_RENEWALS))
async def test_a_renewal_granting_no_time_loses_the_lease_async(
    fake: Callable[[Scenario], FakeServer], case: str
) -> None:
    server = fake(by_path(grant(), NONSENSE_RENEWALS[case], answer(200, "{}")))
    async with AsyncClient(server.url, timeout=5) as client:
        lease = await client.acquire("r", ttl=3, holder="h")
        await asyncio.wait_for(lease.lost.wait(), 2.2)
        assert lease.lost_reason == "expired" and server.count("/renew") <= 3


TINY_RENEWAL = answer(200, json.dumps({"ttl_seconds": 3, "expires_in_ms": 1, "token": "5"}))


def test_renewals_are_at_least_the_floor_apart(fake: Callable[[Scenario], FakeServer]) -> None:
    server = fake(by_path(grant(), TINY_RENEWAL, answer(200, "{}")))
    with Client(server.url, timeout=5) as client:
        lease = client.acquire("r", ttl=3, holder="h")
        time.sleep(2.5)  # renewals from about 1 s, each granting 1 ms
        assert 3 <= server.count("/renew") <= 25
        lease.release()


@pytest.mark.asyncio
async def test_renewals_are_at_least_the_floor_apart_async(fake: Callable[[Scenario], FakeServer]) -> None:
    server = fake(by_path(grant(), TINY_RENEWAL, answer(200, "{}")))
    async with AsyncClient(server.url, timeout=5) as client:
        lease = await client.acquire("r", ttl=3, holder="h")
        await asyncio.sleep(2.5)
        assert 3 <= server.count("/renew") <= 25
        await lease.release()


def test_lifetime_rules() -> None:
    assert protocol.lifetime(3, 2**64 - 1) == 3.0
    assert protocol.lifetime(3, 5000, slack=4.0) == 5.0  # a queued acquire: TTL from the grant
    assert protocol.lifetime(0, 3000) == 0.0 and protocol.lifetime(3, -1) == 0.0
    assert protocol.lifetime(10**400, 10**400) == protocol.MAX_LIFETIME_MS / 1000
    assert protocol.renew_interval(0.0) >= protocol.MIN_RENEW_INTERVAL


# --- 5. timeouts against a server that drips ---

SLOW_HEADERS = drip(b"HTTP/1.1 201 X\r\n", b"x-a: b\r\n")
SLOW_BODY = drip(b"HTTP/1.1 201 X\r\ncontent-type: application/json\r\ncontent-length: 100000\r\n\r\n", b" ")


@pytest.mark.asyncio
@pytest.mark.parametrize("scenario", [SLOW_HEADERS, SLOW_BODY], ids=["headers", "body"])
async def test_async_calls_keep_their_timeout_against_a_dripping_server(
    fake: Callable[[Scenario], FakeServer], scenario: Scenario
) -> None:
    server = fake(scenario)
    async with AsyncClient(server.url, timeout=1.0) as client:
        started = time.monotonic()
        with pytest.raises(TransportError):
            await asyncio.wait_for(client.acquire("r", ttl=3, holder="h"), 8)
        assert time.monotonic() - started < 2.5


def test_sync_calls_keep_their_timeout_against_a_dripping_body(fake: Callable[[Scenario], FakeServer]) -> None:
    server = fake(SLOW_BODY)
    outcome: List[BaseException] = []

    def run() -> None:
        try:
            with Client(server.url, timeout=1.0) as client:
                client.acquire("r", ttl=3, holder="h")
        except BaseException as e:  # noqa: BLE001
            outcome.append(e)

    started = time.monotonic()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(8)
    assert outcome and isinstance(outcome[0], TransportError)
    assert time.monotonic() - started < 2.5


# --- 6. sizes ---

BIG_GRANT = grant(metadata={"pad": "x" * (protocol.MAX_BODY + 10)})


def test_an_answer_over_the_size_limit_is_refused(fake: Callable[[Scenario], FakeServer]) -> None:
    with Client(fake(sends(BIG_GRANT)).url, timeout=5) as client:
        with pytest.raises(ProtocolError):
            client.acquire("r", ttl=3, holder="h")


@pytest.mark.asyncio
async def test_an_answer_over_the_size_limit_is_refused_async(fake: Callable[[Scenario], FakeServer]) -> None:
    async with AsyncClient(fake(sends(BIG_GRANT)).url, timeout=5) as client:
        with pytest.raises(ProtocolError):
            await client.acquire("r", ttl=3, holder="h")


def giant_line_then_event(conn: socket.socket, method: str, path: str, headers: Dict[str, str], n: int) -> None:
    if n == 1:
        conn.sendall(SSE_HEAD + b"id: 1\n\ndata: ")
        for _ in range(3):
            conn.sendall(b"x" * MAX_LINE)
        time.sleep(30)
        return
    conn.sendall(SSE_HEAD + b"id: 1\n\n" + sse_event("2.0").encode())
    time.sleep(30)


def test_an_event_stream_line_over_the_limit_is_an_error_then_the_watch_resumes(
    fake: Callable[[Scenario], FakeServer],
) -> None:
    server = fake(giant_line_then_event)
    with Client(server.url, timeout=5) as client:
        assert ids(collect(client.watch(), 2)) == ["ProtocolError", "2.0"]


@pytest.mark.asyncio
async def test_an_event_stream_line_over_the_limit_is_an_error_then_the_watch_resumes_async(
    fake: Callable[[Scenario], FakeServer],
) -> None:
    server = fake(giant_line_then_event)
    async with AsyncClient(server.url, timeout=5) as client:
        stream = client.watch()
        assert ids(await acollect(stream, 2)) == ["ProtocolError", "2.0"]
        await stream.aclose()


def test_an_event_stream_message_over_the_limit_is_refused() -> None:
    parser = Parser()
    line = "data: " + "x" * 1000
    with pytest.raises(ProtocolError):
        for _ in range(MAX_LINE // 1000 + 2):
            parser.feed(line)


# --- 7. no reconnection storm ---

FLAP = sends(SSE_HEAD + b": hi\n\n")


def test_a_watch_backs_off_after_connections_that_deliver_nothing(fake: Callable[[Scenario], FakeServer]) -> None:
    server = fake(FLAP)
    with Client(server.url, timeout=5) as client:
        stream = client.watch()
        collect(stream, 1, within=2.2)
        stream._closed = True  # the reading thread ends after its next pause
        # with back-off: connections at about 0, 0.2, 0.6, 1.4 s; without: every 0.2 s
        assert 2 <= server.count("/v1/watch") <= 5


@pytest.mark.asyncio
async def test_an_async_watch_backs_off_after_connections_that_deliver_nothing(
    fake: Callable[[Scenario], FakeServer],
) -> None:
    server = fake(FLAP)
    async with AsyncClient(server.url, timeout=5) as client:
        stream = client.watch()
        await acollect(stream, 1, within=2.2)
        assert 2 <= server.count("/v1/watch") <= 5
        await stream.aclose()
