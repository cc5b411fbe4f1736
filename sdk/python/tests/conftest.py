"""Real dependencies for the tests: an etcd member and a lease-proxy binary on free loopback
ports (the proxy from ``$LEASE_PROXY_BIN``, else the workspace's ``target/debug/lease-proxy``,
which ``scripts/python-tests.sh`` builds), an upstream that records what the proxy forwards, and
a TCP relay that delays the proxy's answers."""

from __future__ import annotations

import base64
import json
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Dict, Iterator, List, Optional

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[3]
READY_WITHIN = 30.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(check, within: float, what: str, log: Optional[Path] = None) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    logs = log.read_text(errors="replace")[-4000:] if log is not None and log.exists() else ""
    raise RuntimeError(f"{what} not ready within {within}s\n{logs}")


def stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@dataclass
class Etcd:
    url: str

    def revoke(self, lease_id: str) -> None:
        """Revokes an etcd lease directly (the proxy's lease ids are etcd's, in decimal), through
        etcd's JSON gateway: what a lease lost to etcd looks like to the proxy."""
        response = httpx.post(f"{self.url}/v3/lease/revoke", json={"ID": lease_id}, timeout=10)
        response.raise_for_status()

    def compact(self, revision: Optional[int] = None) -> None:
        """Compacts etcd's history up to ``revision`` (default: its current revision)."""
        if revision is None:
            header = httpx.post(f"{self.url}/v3/kv/range", json={"key": "AA=="}, timeout=10).json()["header"]
            revision = int(header["revision"])
        response = httpx.post(
            f"{self.url}/v3/kv/compaction",
            json={"revision": str(revision), "physical": True},
            timeout=10,
        )
        response.raise_for_status()


@pytest.fixture(scope="session")
def workdir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="lease-proxy-py-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def start_etcd(workdir: Path, name: str, *extra: str) -> "tuple[subprocess.Popen, str]":
    """A one-member etcd named `name` on free loopback ports (data and log in `workdir`), with
    `extra` flags; waits until it is healthy and returns its process and client URL."""
    binary = os.environ.get("ETCD_BIN") or shutil.which("etcd")
    if binary is None:
        pytest.fail("etcd not on PATH (scripts/deps.sh installs etcd-server)")
    client, peer = free_port(), free_port()
    client_url, peer_url = f"http://127.0.0.1:{client}", f"http://127.0.0.1:{peer}"
    log = workdir / f"{name}-etcd.log"
    process = subprocess.Popen(
        [binary, "--name", name, "--data-dir", str(workdir / f"{name}-etcd"),
         "--listen-client-urls", client_url, "--advertise-client-urls", client_url,
         "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
         "--initial-cluster", f"{name}={peer_url}", "--initial-cluster-state", "new",
         "--logger", "zap", "--log-level", "warn", *extra],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        wait_until(
            lambda: httpx.get(f"{client_url}/health", timeout=1).json().get("health") == "true",
            READY_WITHIN,
            "etcd",
            log,
        )
    except BaseException:
        stop(process)
        raise
    return process, client_url


@pytest.fixture(scope="session")
def etcd(workdir: Path) -> Iterator[Etcd]:
    process, client_url = start_etcd(workdir, "m0")
    try:
        yield Etcd(client_url)
    finally:
        stop(process)


@dataclass
class Recorded:
    method: str
    path: str
    headers: Dict[str, str]
    body: bytes


@dataclass
class Upstream:
    """What the proxy forwarded, in order."""

    url: str
    requests: List[Recorded] = field(default_factory=list)


@pytest.fixture(scope="session")
def upstream() -> Iterator[Upstream]:
    recorded = Upstream(url="")

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            body = self.rfile.read(length) if length else b""
            recorded.requests.append(
                Recorded(self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body)
            )
            self.send_response(200)
            self.send_header("content-length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        do_GET = do_PUT = do_POST = do_DELETE = _answer

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    recorded.url = f"http://127.0.0.1:{server.server_address[1]}"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield recorded
    server.shutdown()


def proxy_binary() -> str:
    binary = os.environ.get("LEASE_PROXY_BIN") or str(ROOT / "target" / "debug" / "lease-proxy")
    if not os.access(binary, os.X_OK):
        pytest.fail(
            f"no lease-proxy at {binary}: build it (cargo build -p lease-proxy) or set LEASE_PROXY_BIN"
        )
    return binary


@pytest.fixture(scope="session")
def key_file(workdir: Path) -> Path:
    path = workdir / "fencing.key"
    secret = base64.urlsafe_b64encode(secrets.token_bytes(32)).decode().rstrip("=")
    path.write_text(f"k1 {secret}\n")
    return path


@pytest.fixture(scope="session")
def proxy(workdir: Path, etcd: Etcd, upstream: Upstream, key_file: Path) -> Iterator[str]:
    """A lease-proxy on a free port, forwarding to ``upstream``; yields its base URL."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = workdir / "proxy.log"
    process = subprocess.Popen(
        [
            proxy_binary(),
            "--listen",
            f"127.0.0.1:{port}",
            "--etcd-endpoints",
            etcd.url,
            "--etcd-prefix",
            "/lease-proxy-py/",
            "--key-file",
            str(key_file),
            "--data-dir",
            str(workdir / "proxy"),
            "--upstream",
            upstream.url,
        ],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    try:
        wait_until(
            lambda: httpx.get(f"{url}/readyz", timeout=1).status_code == 200, READY_WITHIN, "lease-proxy", log
        )
        yield url
    finally:
        stop(process)


@pytest.fixture
def resource() -> str:
    """A resource name no other test uses."""
    return f"py-{uuid.uuid4().hex[:12]}"


class Relay:
    """A TCP relay in front of the proxy: each chunk of the proxy's answers is held back
    ``delay`` seconds; with ``drop_first`` the first connection is closed when the proxy's first
    answer on it arrives, which is not passed on (a lost answer)."""

    def __init__(self, target_port: int, delay: float = 0.0, drop_first: bool = False) -> None:
        self._target = target_port
        self._delay = delay
        self._drop_next = drop_first
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(16)
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self.connections = 0
        self._open: List[socket.socket] = []
        self.blocked = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                downstream, _ = self._listener.accept()
            except OSError:
                return
            if self.blocked:  # no path to the proxy: the connection ends at once
                downstream.close()
                continue
            self.connections += 1
            drop, self._drop_next = self._drop_next, False
            upstream = socket.create_connection(("127.0.0.1", self._target))
            self._open += [downstream, upstream]
            threading.Thread(target=self._pipe, args=(downstream, upstream, 0.0, False), daemon=True).start()
            threading.Thread(
                target=self._pipe, args=(upstream, downstream, self._delay, drop), daemon=True
            ).start()

    def _pipe(self, source: socket.socket, sink: socket.socket, delay: float, drop: bool) -> None:
        try:
            while True:
                chunk = source.recv(65536)
                if not chunk or drop:
                    break  # with drop: the proxy acted on the request, its answer is lost
                if delay:
                    time.sleep(delay)
                sink.sendall(chunk)
        except OSError:
            pass
        for s in (source, sink):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def cut(self, block: bool = False) -> None:
        """Drops every connection open now, both ways (a lost network path); new ones work
        unless `block`, until `blocked` is set False again."""
        self.blocked = block
        cut, self._open = self._open, []
        for s in cut:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        self._listener.close()


@pytest.fixture
def relay(proxy: str) -> Iterator[callable]:
    """Makes :class:`Relay` instances in front of the proxy, closed after the test."""
    made: List[Relay] = []
    port = int(proxy.rsplit(":", 1)[1])

    def make(delay: float = 0.0, drop_first: bool = False) -> Relay:
        r = Relay(port, delay, drop_first)
        made.append(r)
        return r

    yield make
    for r in made:
        r.close()


def take_over(url: str, resource: str, holder: str, ttl: int, within: float) -> "tuple[float, dict]":
    """Polls an acquire of ``resource`` (no wait, so a 409 means still held when the proxy looked)
    until it succeeds; returns the monotonic instant read before sending the winning request and
    the grant."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        sent = time.monotonic()
        response = httpx.post(
            f"{url}/v1/leases/{resource}", json={"holder": holder, "ttl_seconds": ttl}, timeout=10
        )
        if response.status_code == 201:
            return sent, response.json()
        assert response.status_code == 409, response.text
        time.sleep(0.05)
    raise AssertionError(f"{resource} not taken over within {within}s")


def problem_slug(response: httpx.Response) -> str:
    return str(json.loads(response.content).get("type", "")).rsplit("/", 1)[-1]
