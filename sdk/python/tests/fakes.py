"""A hostile lease-proxy for the tests: a raw-socket HTTP server on a free loopback port whose
scenario function writes whatever bytes it likes (bad JSON, absurd numbers, headers dripped one a
second, endless bodies, cut event streams)."""

from __future__ import annotations

import json
import socket
import threading
import time
from typing import Any, Callable, Dict, List, Optional

#: ``scenario(conn, method, path, headers, n)``: answers request number ``n`` (1-based).
Scenario = Callable[[socket.socket, str, str, Dict[str, str], int], None]

GRANT: Dict[str, Any] = {
    "resource": "r",
    "holder": "h",
    "lease_id": "1",
    "secret": "s",
    "token": "5",
    "fencing_token": "v1.x",
    "ttl_seconds": 3,
    "expires_in_ms": 3000,
}
SSE_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n\r\n"


def answer(status: int, body: "bytes | str", ctype: str = "application/json") -> bytes:
    """A whole HTTP/1.1 answer that closes the connection."""
    data = body.encode() if isinstance(body, str) else body
    head = f"HTTP/1.1 {status} X\r\ncontent-type: {ctype}\r\ncontent-length: {len(data)}\r\nconnection: close\r\n\r\n"
    return head.encode() + data


def grant(**fields: Any) -> bytes:
    """A 201 acquire answer, ``fields`` replacing the normal ones."""
    return answer(201, json.dumps(dict(GRANT, **fields)))


def sse_event(id: str, kind: str = "acquired", token: int = 2) -> str:
    data = {"type": kind, "resource": "a", "holder": "h", "token": str(token), "revision": token, "lease_id": "9"}
    return f"id: {id}\nevent: {kind}\ndata: {json.dumps(data)}\n\n"


class FakeServer:
    """Serves ``scenario`` on ``127.0.0.1:<free port>``, one thread per connection, recording
    each request as ``(method, path, headers)`` with the monotonic instant it arrived."""

    def __init__(self, scenario: Scenario) -> None:
        self.requests: List[tuple] = []
        self.times: List[float] = []
        self._scenario = scenario
        self._lock = threading.Lock()
        self._conns: List[socket.socket] = []
        self._closed = False
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def count(self, fragment: str = "") -> int:
        """Requests so far whose path contains ``fragment``."""
        with self._lock:
            return sum(1 for _, path, _ in self.requests if fragment in path)

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                self._conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            buf = b""
            while b"\r\n\r\n" not in buf:
                data = conn.recv(65536)
                if not data:
                    return
                buf += data
            head, _, rest = buf.partition(b"\r\n\r\n")
            lines = head.decode("latin1").split("\r\n")
            method, path = lines[0].split()[:2]
            headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
            length = int(headers.get("content-length", "0"))
            while len(rest) < length:
                rest += conn.recv(65536)
            with self._lock:
                self.requests.append((method, path, headers))
                self.times.append(time.monotonic())
                n = len(self.requests)
            self._scenario(conn, method, path, headers, n)
        except OSError:
            pass
        finally:
            try:
                conn.close()
            except OSError:
                pass

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def sends(data: bytes, then_sleep: float = 0.0) -> Scenario:
    """A scenario answering every request with ``data``."""

    def scenario(conn: socket.socket, method: str, path: str, headers: Dict[str, str], n: int) -> None:
        conn.sendall(data)
        time.sleep(then_sleep)

    return scenario


def drip(first: bytes, piece: bytes, every: float = 0.3, limit: Optional[float] = 30.0) -> Scenario:
    """Sends ``first``, then ``piece`` every ``every`` seconds (a slowloris)."""

    def scenario(conn: socket.socket, method: str, path: str, headers: Dict[str, str], n: int) -> None:
        conn.sendall(first)
        end = time.monotonic() + (limit or 1e9)
        while time.monotonic() < end:
            time.sleep(every)
            conn.sendall(piece)

    return scenario
