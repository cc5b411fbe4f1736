"""Two unmodified third-party etcd clients against lease-proxy and against real etcd, side by
side: PyPI's ``etcd3`` (python-etcd3, in this process) and npm's ``etcd3`` (one ``node`` process
running ``npm-etcd3/cases.js``). Each client runs one fixed sequence of cases once straight
against etcd and once against the proxy's gRPC listener; the answers must be equal once what
legitimately differs between two runs is normalised: revisions and lease ids become labels in
order of first appearance (so equal stays equal and a wrong one shows), times and sizes become
ranges, and the documented differences of docs/API.md are mapped where each is met (each with
its line quoted).

Both sides use the same client keys (``py/…``, ``/locks/py-…``, ``npm/…``,
``election/npm-…``): the etcd side writes them at etcd's root, the proxy side inside the
proxy's namespace. A watch of every etcd key, straight to etcd and held through all the runs,
then shows that every write of a proxy-side run lay under the proxy's prefix (client keys in its
namespace, the rest its own ``/v3`` lease markers) and that nothing the etcd-side run left was
touched.

The proxy runs with ``--idle-timeout 1s``: the ``idle`` case is a python-etcd3 client alone in
a process of its own whose next call after a pause past it must work, as against etcd.

Needs etcd on PATH (as conftest's), Debian's ``/usr/bin/node`` (or ``$NODE_BIN``), and the npm
client installed by ``scripts/python-tests.sh`` (``npm ci`` into ``target/npm-etcd3``, or
``$NPM_ETCD3_DIR``). ``COMPAT_DUMP_DIR=dir`` writes both sides' normalised answers there.

Both clients share the stack, the labels and the namespace audit in one pytest process;
python-etcd3's cases are one function, as npm's are one script.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import warnings
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import grpc
import httpx
import pytest

with warnings.catch_warnings():
    # python-etcd3's generated modules use protobuf 3's descriptor calls, deprecated since.
    warnings.simplefilter("ignore", DeprecationWarning)
    import etcd3
    from etcd3 import exceptions as etcd3_exceptions

from conftest import ROOT, READY_WITHIN, free_port, proxy_binary, start_etcd, stop, wait_until

ETCD_PREFIX = "/lease-proxy-compat/"
# The proxy's /v3 namespace: the default, `{etcd-prefix}v3/kv/` (docs/API.md, "Namespace").
NAMESPACE = ETCD_PREFIX + "v3/kv/"
# Where the proxy keeps the markers of /v3 leases (proxy/src/keys.rs, `v3_leases`).
LEASE_MARKERS = ETCD_PREFIX + "v3/leases/"
NPM_DIR = Path(__file__).resolve().parent / "npm-etcd3"
NODE_TIMEOUT = 90.0

pytestmark = [
    # python-etcd3's watch thread opens a new stream whenever its stream ends, also after the
    # client's close(), where that raises "Channel closed!" in the thread: the client's, not ours.
    pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning"),
    # Its lock() waits with tenacity 6's old call style (tenacity 7 removed it; 6.3.1 is pinned).
    pytest.mark.filterwarnings("ignore:.*function must accept single:DeprecationWarning"),
]


# --- the stack: etcd (progress notifications every second), the proxy, the audit watch ---------


@dataclass
class Side:
    name: str  # "etcd" or "proxy"
    host: str
    port: int

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


@dataclass
class Event:
    type: str
    key: bytes
    revision: int


@dataclass
class Audit:
    """Every event of every etcd key, from a watch straight to etcd."""

    events: List[Event] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def callback(self, response: Any) -> None:
        if isinstance(response, Exception):
            self.events.append(Event("ERROR", repr(response).encode(), -1))
            return
        with self.lock:
            for e in response.events:
                kind = "PUT" if isinstance(e, etcd3.events.PutEvent) else "DELETE"
                self.events.append(Event(kind, bytes(e.key), int(e.mod_revision)))

    def between(self, after: int, upto: int) -> List[Event]:
        with self.lock:
            return [e for e in self.events if after < e.revision <= upto or e.revision < 0]


@dataclass
class Stack:
    etcd: Side
    proxy: Side
    direct: etcd3.Etcd3Client  # straight to etcd, for the audit and the compactions
    audit: Audit

    def revision(self) -> int:
        return int(self.direct.get_response(b"\0").header.revision)

    def settle(self, upto: int, within: float = 5.0) -> None:
        """Waits until the audit watch has seen every revision up to `upto`."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            with self.audit.lock:
                if any(e.revision >= upto for e in self.audit.events):
                    return
            time.sleep(0.05)

    def compact(self) -> int:
        """Compacts etcd's history up to its current revision, straight to etcd (the proxy
        refuses Compact: docs/API.md, "`Compact`, `RangeStream` | `PermissionDenied`")."""
        revision = self.revision()
        self.direct.compact(revision, physical=True)
        return revision

    def outside_keys(self) -> Dict[bytes, Tuple[int, bytes]]:
        """Every etcd key outside the proxy's prefix: key -> (mod revision, value)."""
        return {
            bytes(meta.key): (int(meta.mod_revision), bytes(value))
            for value, meta in self.direct.get_all()
            if not bytes(meta.key).startswith(ETCD_PREFIX.encode())
        }


@pytest.fixture(scope="module")
def stack(workdir: Path, key_file: Path) -> Iterator[Stack]:
    # npm's watch builder always asks for progress notifications: one a second, so a case can
    # see one arrive on an idle watch.
    etcd_process, etcd_url = start_etcd(workdir, "compat", "--experimental-watch-progress-notify-interval", "1s")
    etcd_side = Side("etcd", "127.0.0.1", int(etcd_url.rsplit(":", 1)[1]))
    port = free_port()
    log = workdir / "compat-proxy.log"
    proxy_process = subprocess.Popen(
        [
            proxy_binary(),
            "--listen",
            f"127.0.0.1:{port}",
            "--etcd-endpoints",
            etcd_side.url,
            "--etcd-prefix",
            ETCD_PREFIX,
            "--key-file",
            str(key_file),
            "--data-dir",
            str(workdir / "compat-proxy"),
            # Connections idle for a second are closed (a request's headers due within one):
            # the `idle` case pauses past it.
            "--idle-timeout",
            "1s",
            "--header-read-timeout",
            "1s",
        ],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    direct = None
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until(
            lambda: httpx.get(f"{url}/readyz", timeout=1).status_code == 200, READY_WITHIN, "lease-proxy", log
        )
        direct = etcd3.client(host="127.0.0.1", port=etcd_side.port, timeout=10)
        audit = Audit()
        direct.add_watch_callback(b"\0", audit.callback, range_end=b"\0")
        yield Stack(etcd_side, Side("proxy", "127.0.0.1", port), direct, audit)
    finally:
        if direct is not None:
            direct.close()
        stop(proxy_process)
        stop(etcd_process)


# --- normalisation -------------------------------------------------------------------------------


class Labels:
    """Run-local values (revisions, lease ids) as labels in order of first appearance: two runs
    agree when the same value stands at the same places, whatever it is."""

    def __init__(self) -> None:
        self._maps: Dict[str, Dict[int, str]] = defaultdict(dict)

    def __call__(self, kind: str, value: Any) -> Any:
        number = int(value)
        if number == 0:
            return 0
        labels = self._maps[kind]
        return labels.setdefault(number, f"{kind}#{len(labels) + 1}")


def normalise_npm(value: Any, labels: Labels, field_name: str = "") -> Any:
    """npm's answers: revision fields and lease ids labelled (the values are int64 strings)."""
    if isinstance(value, dict):
        return {k: normalise_npm(v, labels, k) for k, v in value.items()}
    if isinstance(value, list):
        return [normalise_npm(v, labels, field_name) for v in value]
    if field_name in ("create_revision", "mod_revision") and value is not None:
        return labels("rev", value)
    if field_name in ("lease", "ID", "id") and isinstance(value, str) and value.lstrip("-").isdigit():
        return labels("lease", value)
    return value


def diff(client: str, etcd_side: Dict[str, Any], proxy_side: Dict[str, Any]) -> List[str]:
    """The cases whose normalised answers differ; with ``$COMPAT_DUMP_DIR`` set, both sides'
    answers are also written there (``{client}.etcd.json``, ``{client}.proxy.json``)."""
    dump = os.environ.get("COMPAT_DUMP_DIR")
    if dump:
        Path(dump).mkdir(parents=True, exist_ok=True)
        for name, answers in (("etcd", etcd_side), ("proxy", proxy_side)):
            (Path(dump) / f"{client}.{name}.json").write_text(json.dumps(answers, indent=1, default=str))
    lines = []
    for case in list(dict.fromkeys([*etcd_side, *proxy_side])):
        a, b = etcd_side.get(case), proxy_side.get(case)
        if a != b:
            lines.append(
                f"{case}:\n  etcd:  {json.dumps(a, sort_keys=True, default=str)}\n"
                f"  proxy: {json.dumps(b, sort_keys=True, default=str)}"
            )
    return lines


# --- python-etcd3 -------------------------------------------------------------------------------


def rpc_error(e: BaseException) -> Dict[str, str]:
    """An error as the client raised it: its class, and for a raw gRPC error its code and text."""
    if isinstance(e, grpc.RpcError):
        return {"error": type(e).__name__, "code": e.code().name, "details": e.details()}
    return {"error": type(e).__name__}


class Collector:
    """What a watch iterator or callback hands over, in a thread of its own."""

    def __init__(self) -> None:
        self.items: List[Any] = []
        self.done = threading.Event()

    def callback(self, item: Any) -> None:
        self.items.append(item)

    def drain(self, iterator: Iterator[Any]) -> None:
        def run() -> None:
            try:
                for item in iterator:
                    self.items.append(item)
            except Exception as e:  # noqa: BLE001 - the error is the observation
                self.items.append(e)
            self.done.set()

        threading.Thread(target=run, daemon=True).start()

    def wait_for(self, count: int, within: float = 8.0, kind: Optional[type] = None) -> None:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if len([i for i in self.items if kind is None or isinstance(i, kind)]) >= count:
                return
            time.sleep(0.02)


def python_cases(c: etcd3.Etcd3Client, side: Side, stack: Stack) -> Dict[str, Any]:
    """python-etcd3's calls in a fixed order; each case's answer, normalised."""
    n = Labels()
    out: Dict[str, Any] = {}

    def kv(meta: Any, value: Optional[bytes] = None) -> Optional[Dict[str, Any]]:
        if meta is None:
            return None
        kv_ = getattr(meta, "kv", meta)  # KVMetadata has the fields; so does a KeyValue
        return {
            "key": bytes(meta.key).decode(),
            "value": None if value is None else bytes(value).decode(),
            "version": int(meta.version),
            "create": n("rev", meta.create_revision),
            "mod": n("rev", meta.mod_revision),
            "lease": n("lease", getattr(meta, "lease_id", None) or getattr(kv_, "lease", 0)),
        }

    def pb_kv(k: Any) -> Dict[str, Any]:
        return {
            "key": bytes(k.key).decode(),
            "value": bytes(k.value).decode(),
            "version": int(k.version),
            "create": n("rev", k.create_revision),
            "mod": n("rev", k.mod_revision),
            "lease": n("lease", k.lease),
        }

    def event(e: Any) -> Any:
        if isinstance(e, Exception):
            return rpc_error(e) if not isinstance(e, etcd3_exceptions.RevisionCompactedError) else {
                "error": "RevisionCompactedError",
                "compacted_revision": n("rev", e.compacted_revision),
            }
        kind = "PUT" if isinstance(e, etcd3.events.PutEvent) else "DELETE"
        prev = e._event.prev_kv if e._event.HasField("prev_kv") else None
        return {"type": kind, "kv": pb_kv(e._event.kv), "prev": pb_kv(prev) if prev is not None else None}

    def case(name: str, fn: Callable[[], Any]) -> None:
        try:
            out[name] = fn()
        except Exception as e:  # noqa: BLE001 - a failure on one side is an answer to compare
            out[name] = {"raised": rpc_error(e), "text": str(e)[:300]}

    # put / get / get_prefix / get_range with sort / delete with prev_kv / delete_prefix
    def kv_case() -> Dict[str, Any]:
        r: Dict[str, Any] = {}
        c.put("py/kv/b", "2")
        c.put("py/kv/a", "1")
        c.put("py/kv/c", "3")
        prev = c.put("py/kv/a", "1b", prev_kv=True)
        r["put_prev_kv"] = pb_kv(prev.prev_kv)
        r["put_no_prev"] = c.put("py/kv/d", "4", prev_kv=True).HasField("prev_kv")
        value, meta = c.get("py/kv/a")
        r["get"] = kv(meta, value)
        r["get_missing"] = list(c.get("py/kv/none"))
        value, meta = c.get("py/kv/a", serializable=True)
        r["get_serializable"] = kv(meta, value)
        r["get_prefix"] = [kv(m, v) for v, m in c.get_prefix("py/kv/")]
        r["get_prefix_desc_value"] = [
            bytes(v).decode() for v, _ in c.get_prefix("py/kv/", sort_order="descend", sort_target="value")
        ]
        r["get_prefix_keys_only"] = [
            (bytes(m.key).decode(), bytes(v)) for v, m in c.get_prefix("py/kv/", keys_only=True)
        ]
        r["get_prefix_limit"] = [
            bytes(m.key).decode() for _, m in c.get_prefix("py/kv/", sort_order="ascend", limit=2)
        ]
        for target in ("key", "version", "create", "mod", "value"):
            r[f"get_range_{target}"] = [
                bytes(m.key).decode()
                for _, m in c.get_range("py/kv/a", "py/kv/d", sort_order="descend", sort_target=target)
            ]
        r["put_if_not_exists"] = [c.put_if_not_exists("py/kv/a", "x"), c.put_if_not_exists("py/kv/e", "5")]
        r["replace"] = [c.replace("py/kv/e", "5", "6"), c.replace("py/kv/e", "5", "7")]
        deleted = c.delete("py/kv/a", prev_kv=True, return_response=True)
        r["delete_prev_kv"] = {"deleted": deleted.deleted, "prev": [pb_kv(p) for p in deleted.prev_kvs]}
        r["delete_missing"] = c.delete("py/kv/a")
        r["delete_prefix"] = c.delete_prefix("py/kv/").deleted
        r["after"] = [kv(m, v) for v, m in c.get_prefix("py/kv/")]
        return r

    case("kv", kv_case)

    # transactions: compares on value, version, create and mod; nested txns; range ops inside
    def txn_case() -> Dict[str, Any]:
        t = c.transactions
        r: Dict[str, Any] = {}
        c.delete_prefix("py/txn/")
        c.put("py/txn/k", "v1")
        c.put("py/txn/k", "v2")
        _, meta = c.get("py/txn/k")

        def shape(result: Tuple[bool, List[Any]]) -> Dict[str, Any]:
            ok, responses = result
            shaped = []
            for x in responses:
                if isinstance(x, list):  # a range: (value, KVMetadata) pairs
                    shaped.append({"range": [kv(m, v) for v, m in x]})
                else:
                    shaped.append(proto(x))
            return {"succeeded": ok, "responses": shaped}

        def proto(x: Any) -> Any:
            which = x.WhichOneof("response")
            inner = getattr(x, which)
            if which == "response_put":
                return {"put": pb_kv(inner.prev_kv) if inner.HasField("prev_kv") else None}
            if which == "response_delete_range":
                return {"delete": inner.deleted, "prev": [pb_kv(p) for p in inner.prev_kvs]}
            if which == "response_range":
                return {"range": [pb_kv(k) for k in inner.kvs], "count": inner.count, "more": inner.more}
            if which == "response_txn":
                return {"txn": inner.succeeded, "responses": [proto(y) for y in inner.responses]}
            return {which: str(inner)}

        r["value_version_create_mod"] = shape(
            c.transaction(
                compare=[
                    t.value("py/txn/k") == "v2",
                    t.version("py/txn/k") == 2,
                    t.create("py/txn/k") < int(meta.mod_revision),
                    t.mod("py/txn/k") == int(meta.mod_revision),
                    t.version("py/txn/none") == 0,
                ],
                success=[
                    t.put("py/txn/k", "v3", prev_kv=True),
                    t.get("py/txn/k"),
                    t.txn(
                        compare=[t.value("py/txn/k") == "v3"],
                        success=[t.put("py/txn/nested", "n1"), t.get("py/txn/", "py/txn0")],
                        failure=[t.put("py/txn/never1", "x")],
                    ),
                ],
                failure=[t.put("py/txn/never2", "x")],
            )
        )
        r["failure_branch"] = shape(
            c.transaction(
                compare=[t.value("py/txn/k") != "v3", t.mod("py/txn/k") > 0],
                success=[t.put("py/txn/never3", "x")],
                failure=[
                    t.get("py/txn/k"),
                    t.txn(
                        compare=[t.create("py/txn/nested") == 0],
                        success=[t.put("py/txn/never4", "x")],
                        failure=[t.delete("py/txn/nested", prev_kv=True), t.get("py/txn/nested")],
                    ),
                    t.delete("py/txn/k", prev_kv=True),
                ],
            )
        )
        r["empty_compare"] = shape(c.transaction(compare=[], success=[t.put("py/txn/e", "1")], failure=[]))
        c.delete_prefix("py/txn/")
        return r

    case("txn", txn_case)

    # leases: grant, refresh (one LeaseKeepAlive request, then half-close), TTL with keys, revoke
    def lease_case() -> Dict[str, Any]:
        r: Dict[str, Any] = {}
        lease = c.lease(7)
        r["grant"] = {"id": n("lease", lease.id), "ttl": lease.ttl}
        c.put("py/lease/k1", "a", lease=lease)
        c.put("py/lease/k2", "b", lease=lease.id)
        refreshed = lease.refresh()
        r["refresh"] = [{"ID": n("lease", x.ID), "TTL": x.TTL} for x in refreshed]
        info = c.get_lease_info(lease.id)
        r["info"] = {
            "ID": n("lease", info.ID),
            "grantedTTL": info.grantedTTL,
            "TTL_in_range": 0 < info.TTL <= 7,
            "keys": sorted(bytes(k).decode() for k in info.keys),
        }
        r["granted_ttl"] = lease.granted_ttl
        _, meta = c.get("py/lease/k1")
        r["key_lease"] = n("lease", meta.lease_id)
        lease.revoke()
        r["after_revoke"] = [list(c.get("py/lease/k1")), list(c.get("py/lease/k2"))]
        gone = c.get_lease_info(lease.id)
        r["info_after_revoke"] = {"ID": n("lease", gone.ID), "TTL": gone.TTL, "grantedTTL": gone.grantedTTL}
        r["refresh_after_revoke"] = [{"ID": n("lease", x.ID), "TTL": x.TTL} for x in lease.refresh()]
        try:
            lease.revoke()
            r["revoke_again"] = "ok"
        except Exception as e:  # noqa: BLE001
            r["revoke_again"] = rpc_error(e)
        try:
            c.put("py/lease/k3", "c", lease=lease.id)
            r["put_on_revoked"] = "ok"
        except Exception as e:  # noqa: BLE001
            r["put_on_revoked"] = rpc_error(e)
        r["refresh_unknown"] = [{"ID": x.ID, "TTL": x.TTL} for x in c.refresh_lease(7587)]
        return r

    case("lease", lease_case)

    # a lease left to expire: etcd's minimum TTL on the grant, its key deleted, a watch sees it
    def expiry_case() -> Dict[str, Any]:
        r: Dict[str, Any] = {}
        lease = c.lease(1)
        r["granted_ttl"] = lease.ttl  # etcd raises a TTL below its minimum (2 s here)
        c.put("py/expiry/k", "v", lease=lease)
        events, cancel = c.watch("py/expiry/k", prev_kv=True)
        seen = Collector()
        seen.drain(events)
        seen.wait_for(1, within=8)
        cancel()
        r["events"] = [event(e) for e in seen.items[:1]]
        r["info_after_expiry"] = c.get_lease_info(lease.id).TTL
        r["refresh_after_expiry"] = [x.TTL for x in lease.refresh()]
        return r

    case("expiry", expiry_case)

    # lock(): acquire / release; two locks contending: the second waits, then acquires
    def lock_case() -> Dict[str, Any]:
        r: Dict[str, Any] = {}
        first = c.lock("py-lock", ttl=10)
        r["first_acquired"] = first.acquire(timeout=5)
        r["first_is_acquired"] = first.is_acquired()
        value, meta = c.get("/locks/py-lock")
        r["lock_key"] = {"key": bytes(meta.key).decode(), "value_is_uuid": value == first.uuid}
        r["refresh"] = [x.TTL for x in first.refresh()]
        second = c.lock("py-lock", ttl=10)
        result: Dict[str, Any] = {}

        def contend() -> None:
            started = time.monotonic()
            result["acquired"] = second.acquire(timeout=10)
            result["waited"] = time.monotonic() - started

        thread = threading.Thread(target=contend, daemon=True)
        thread.start()
        time.sleep(0.7)
        r["second_waiting_while_held"] = thread.is_alive()
        r["second_not_acquired_yet"] = not second.is_acquired()
        r["first_released"] = first.release()
        thread.join(10)
        r["second_acquired_after_release"] = result.get("acquired")
        r["second_waited_at_least_the_hold"] = result.get("waited", 0) >= 0.6
        r["second_is_acquired"] = second.is_acquired()
        r["first_release_again"] = first.release()
        r["second_released"] = second.release()
        free = c.lock("py-lock", ttl=10)
        r["try_lock_on_free"] = free.acquire(timeout=0)
        r["try_lock_released"] = free.release()
        free.lease.revoke()
        with c.lock("py-lock-2", ttl=10) as held:
            r["context_manager_holds"] = held.is_acquired()
        r["context_manager_released"] = list(c.get("/locks/py-lock-2"))
        return r

    case("lock", lock_case)

    # watch / watch_prefix with prev_kv / add_watch_callback / cancel / history / progress
    def watch_case() -> Dict[str, Any]:
        r: Dict[str, Any] = {}
        start = c.put("py/w/seed", "0").header.revision
        prefix_events, prefix_cancel = c.watch_prefix("py/w/", prev_kv=True)
        prefix = Collector()
        prefix.drain(prefix_events)
        key_events, key_cancel = c.watch("py/w/a")
        key = Collector()
        key.drain(key_events)
        callback = Collector()
        watch_id = c.add_watch_callback("py/w/b", callback.callback)
        r["callback_watch_id"] = watch_id  # ids as etcd assigns them on the client's one stream
        c.put("py/w/a", "1")
        c.put("py/w/b", "2")
        c.put("py/w/a", "3")
        c.delete("py/w/b")
        c.put("py/elsewhere", "x")
        prefix.wait_for(4)
        key.wait_for(2)
        callback.wait_for(2)
        r["prefix"] = [event(e) for e in prefix.items]
        r["key"] = [event(e) for e in key.items]
        r["callback"] = [
            [event(e) for e in resp.events] if not isinstance(resp, Exception) else event(resp)
            for resp in callback.items
        ]
        c.cancel_watch(watch_id)
        prefix_cancel()
        key_cancel()
        prefix.done.wait(5)
        key.done.wait(5)
        c.put("py/w/b", "after-cancel")
        time.sleep(0.3)
        r["after_cancel"] = [len(prefix.items), len(key.items), len(callback.items)]
        r["iterators_ended"] = [prefix.done.is_set(), key.done.is_set()]
        history_events, history_cancel = c.watch_prefix("py/w/", start_revision=start)
        history = Collector()
        history.drain(history_events)
        history.wait_for(6)
        history_cancel()
        r["history"] = [event(e) for e in history.items]
        r["watch_once"] = None
        once = threading.Thread(
            target=lambda: r.__setitem__("watch_once", event(c.watch_once("py/w/once", timeout=5))), daemon=True
        )
        once.start()
        time.sleep(0.3)
        c.put("py/w/once", "1")
        once.join(6)
        try:
            c.watch_once("py/w/quiet", timeout=0.3)
            r["watch_once_timeout"] = "no timeout"
        except etcd3_exceptions.WatchTimedOut:
            r["watch_once_timeout"] = "WatchTimedOut"
        progress = Collector()
        progress_id = c.add_watch_callback("py/w/quiet", progress.callback, progress_notify=True)
        r["progress_watch_id"] = progress_id
        progress.wait_for(1, within=5)
        c.cancel_watch(progress_id)
        r["progress_notify"] = [len(x.events) for x in progress.items[:1] if not isinstance(x, Exception)]
        c.delete_prefix("py/w/")
        c.delete("py/elsewhere")
        return r

    case("watch", watch_case)

    # a watch from a compacted revision; Compact itself through the client
    def compacted_case() -> Dict[str, Any]:
        r: Dict[str, Any] = {}
        old = c.put("py/compact/k", "1").header.revision
        c.put("py/compact/k", "2")
        compacted = stack.compact()
        n("rev", old)
        r["compacted_at"] = n("rev", compacted)
        events, cancel = c.watch("py/compact/k", start_revision=old)
        got = Collector()
        got.drain(events)
        got.wait_for(1)
        cancel()
        r["watch_iterator"] = [event(e) for e in got.items[:1]]
        callback = Collector()
        try:
            c.add_watch_callback("py/compact/k", callback.callback, start_revision=old)
            callback.wait_for(1)
            r["watch_callback"] = [event(e) for e in callback.items[:1]]
        except Exception as e:  # noqa: BLE001
            r["watch_callback"] = {"raised": rpc_error(e)}
        r["watch_from_compacted_revision_itself"] = None
        events, cancel = c.watch("py/compact/k", start_revision=compacted)
        ok = Collector()
        ok.drain(events)
        c.put("py/compact/k", "3")
        ok.wait_for(1)
        cancel()
        r["watch_from_compacted_revision_itself"] = [event(e) for e in ok.items[:1]]
        try:
            c.compact(compacted)
            r["compact_through_client"] = "ok"
        except Exception as e:  # noqa: BLE001
            r["compact_through_client"] = rpc_error(e)
        c.delete("py/compact/k")
        return r

    case("compacted", compacted_case)

    # members and status
    def cluster_case() -> Dict[str, Any]:
        members = list(c.members)
        status = c.status()
        return {
            "members": [
                {"id": n("member", m.id), "name": m.name, "peer_urls": list(m.peer_urls), "client_urls": list(m.client_urls)}
                for m in members
            ],
            "status": {
                "version": status.version,
                "db_size_positive": status.db_size > 0,
                "leader": None if status.leader is None else n("member", status.leader.id),
                "raft_term_positive": status.raft_term > 0,
            },
            "alarms": list(c.list_alarms()),
        }

    case("cluster", cluster_case)

    # errors the client raises
    def errors_case() -> Dict[str, Any]:
        r: Dict[str, Any] = {}
        for name, call in [
            ("get_empty_key", lambda: c.get("")),
            ("put_empty_key", lambda: c.put("", "v")),
            ("put_unknown_lease", lambda: c.put("py/err", "v", lease=7587)),
            ("revoke_unknown_lease", lambda: c.revoke_lease(7587)),
            ("ttl_unknown_lease", lambda: c.get_lease_info(7587).TTL),
        ]:
            try:
                r[name] = {"ok": str(call())}
            except Exception as e:  # noqa: BLE001
                r[name] = rpc_error(e)
        return r

    # limits and refusals: a value over the proxy's message bound, a large answer, Hash,
    # authentication against a server without it, a lease id of the client's choosing
    def limits_case() -> Dict[str, Any]:
        r: Dict[str, Any] = {}

        def chosen_lease_id() -> Any:
            lease = c.lease(5, lease_id=0x7587_0001)
            lease.revoke()
            return lease.id == 0x7587_0001

        for name, call in [
            ("grant_with_chosen_id", chosen_lease_id),
            ("put_100k_value", lambda: c.put("py/huge", b"x" * 100_000).header.revision > 0),
            ("put_4x60k", lambda: [c.put(f"py/big/{i}", b"y" * 60_000).header.revision > 0 for i in range(4)]),
            ("range_240k", lambda: sorted((bytes(m.key).decode(), len(v)) for v, m in c.get_prefix("py/big/"))),
            ("hash", lambda: c.hash() > 0),
            ("authenticate", lambda: etcd3.client(host=side.host, port=side.port, user="u", password="p", timeout=10)),
        ]:
            try:
                r[name] = {"ok": call()}
            except Exception as e:  # noqa: BLE001
                r[name] = rpc_error(e)
        c.delete_prefix("py/big/")
        c.delete("py/huge")
        return r

    case("limits", limits_case)
    case("errors", errors_case)

    # A client quiet for longer than the proxy's --idle-timeout (here 1 s; etcd has none): its
    # next call must still work.
    case("idle", lambda: quiet_process(side))
    return out


# A python-etcd3 client alone in its process: a call, a pause past the proxy's idle timeout, a
# call. grpcio reads nothing while no call is under way in the process (here any other open
# stream, the audit watch say, would keep it reading), so a connection the server closed in
# the pause (GOAWAY or not) fails the next call UNAVAILABLE "Socket closed".
QUIET_CLIENT = """
import json, sys, time, warnings
warnings.simplefilter("ignore")
import etcd3
client = etcd3.client(host=sys.argv[1], port=int(sys.argv[2]), timeout=10)
answers = {}
for step in ("first", "after_a_pause"):
    try:
        answers[step] = [None if v is None else bytes(v).decode() for v in client.get("py/idle")[:1]]
    except Exception as e:
        answers[step] = {"error": type(e).__name__, "text": str(e)}
    if step == "first":
        client.put("py/idle", "after")
        time.sleep(2.5)
print(json.dumps(answers))
"""


def quiet_process(side: Side) -> Any:
    done = subprocess.run(
        [sys.executable, "-c", QUIET_CLIENT, side.host, str(side.port)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def normalise_python(side: Side, out: Dict[str, Any]) -> Dict[str, Any]:
    """The documented differences of the python run, mapped to one shape."""
    cluster = out.get("cluster")
    if isinstance(cluster, dict) and "members" in cluster:
        members = cluster["members"]
        if side.name == "proxy":
            # docs/API.md, gRPC table: "`MemberList` | one member, `lease-proxy`, whose client URL
            # is the address the client called (so auto-syncing clients stay on the proxy)".
            assert [(m["name"], m["client_urls"]) for m in members] == [("lease-proxy", [side.url])], members
        else:
            assert [(m["name"], m["client_urls"]) for m in members] == [("compat", [side.url])], members
        for m in members:
            m["name"], m["client_urls"], m["peer_urls"] = "<member>", ["<the address called>"], ["<peer urls>"]
    compacted = out.get("compacted")
    if isinstance(compacted, dict) and side.name == "proxy":
        # docs/API.md, gRPC table: "| | `Compact`, `RangeStream` | `PermissionDenied
        # "etcdserver: permission denied"` (it compacts every tenant's history)"; etcd itself
        # refuses a compaction at an already compacted revision with OutOfRange.
        assert compacted.get("compact_through_client") == {
            "error": "_InactiveRpcError",
            "code": "PERMISSION_DENIED",
            "details": "etcdserver: permission denied",
        }, compacted.get("compact_through_client")
        compacted["compact_through_client"] = {
            "error": "_InactiveRpcError",
            "code": "OUT_OF_RANGE",
            "details": "etcdserver: mvcc: required revision has been compacted",
        }
    limits = out.get("limits")
    if isinstance(limits, dict) and side.name == "proxy":
        # docs/API.md, gRPC: "Messages are bounded by `--max-body-bytes` (beyond it tonic answers
        # OutOfRange, where etcd's grpc-go says ResourceExhausted)": 64 KiB by default, where
        # etcd takes requests up to 1.5 MiB. Answers are not bounded (range_240k passes).
        assert limits.get("put_100k_value", {}).get("code") == "OUT_OF_RANGE", limits
        limits["put_100k_value"] = {"ok": True}
        # docs/API.md, gRPC table: "`etcdserverpb.Maintenance` | `Status`, `Alarm` (list only) |
        # ... defragment, hash, snapshot, move-leader, downgrade and alarm changes
        # `PermissionDenied`".
        assert limits.get("hash") == {
            "error": "_InactiveRpcError",
            "code": "PERMISSION_DENIED",
            "details": "etcdserver: permission denied",
        }, limits
        limits["hash"] = {"ok": True}
        # docs/API.md, gRPC table, `etcdserverpb.Lease`: "a grant with an explicit non-zero `ID`
        # refused `InvalidArgument`, as `/v3`'s" ("— unlike etcd — `lease/grant` with an explicit
        # non-zero `ID` (it would let a client probe for and pre-take the proxy's own lease ids)").
        assert limits.get("grant_with_chosen_id", {}).get("code") == "INVALID_ARGUMENT", limits
        limits["grant_with_chosen_id"] = {"ok": True}
    return out


# --- the runs ------------------------------------------------------------------------------------


def run_sides(stack: Stack, run: Callable[[Side], Dict[str, Any]]) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """Runs `run` against etcd, then against the proxy, and checks what each wrote in etcd."""
    before = stack.outside_keys()
    r0 = stack.revision()
    etcd_out = run(stack.etcd)
    r1 = stack.revision()
    left_by_etcd_run = stack.outside_keys()
    proxy_out = run(stack.proxy)
    r2 = stack.revision()
    stack.settle(r2)

    # The etcd-side run wrote nothing under the proxy's prefix (the proxy was idle) ...
    etcd_window = stack.audit.between(r0, r1)
    assert not [e for e in etcd_window if e.revision < 0], etcd_window
    # (python-etcd3's lock() drops the lease of every attempt that found the lock held, without
    # revoking it, so a lease granted through the proxy in an earlier run may expire now, and
    # etcd deletes the proxy's marker on it.)
    proxy_writes = [
        e
        for e in etcd_window
        if e.key.startswith(ETCD_PREFIX.encode()) and not (e.type == "DELETE" and e.key.startswith(LEASE_MARKERS.encode()))
    ]
    assert not proxy_writes, proxy_writes
    # ... and every write of the proxy-side run lies under the proxy's prefix: the client's keys
    # in its namespace, the rest its /v3 lease markers.
    proxy_window = stack.audit.between(r1, r2)
    assert proxy_window, "the proxy-side run wrote nothing?"
    outside = [
        e
        for e in proxy_window
        if not (e.key.startswith(NAMESPACE.encode()) or e.key.startswith(LEASE_MARKERS.encode()))
    ]
    assert not outside, f"the proxy-side run touched keys outside its namespace: {outside}"
    client_keys = {e.key for e in proxy_window if e.key.startswith(NAMESPACE.encode())}
    assert client_keys, "no client key written in the namespace"
    # Nothing the etcd-side run left was touched by the proxy-side run.
    assert stack.outside_keys() == left_by_etcd_run
    assert set(before) <= set(left_by_etcd_run) | set(before)
    return etcd_out, proxy_out


def test_python_etcd3_answers_as_against_etcd(stack: Stack) -> None:
    def run(side: Side) -> Dict[str, Any]:
        client = etcd3.client(host=side.host, port=side.port, timeout=10)
        try:
            return normalise_python(side, python_cases(client, side, stack))
        finally:
            client.close()

    etcd_out, proxy_out = run_sides(stack, run)
    differences = diff("python-etcd3", etcd_out, proxy_out)
    assert not differences, "python-etcd3 answered differently:\n" + "\n".join(differences)
    # The cases ran (a client error on both sides would compare equal).
    assert etcd_out["lock"]["second_acquired_after_release"] is True, etcd_out["lock"]
    assert etcd_out["lease"]["refresh"] == [{"ID": "lease#1", "TTL": 7}], etcd_out["lease"]
    assert etcd_out["expiry"]["events"][0]["type"] == "DELETE", etcd_out["expiry"]
    assert etcd_out["watch"]["progress_notify"] == [0], etcd_out["watch"]
    assert etcd_out["watch"]["watch_once"] is not None, etcd_out["watch"]
    assert all("raised" not in v for v in etcd_out.values()), etcd_out


def npm_dir() -> Path:
    base = Path(os.environ.get("NPM_ETCD3_DIR") or ROOT / "target" / "npm-etcd3")
    if not (base / "node_modules" / "etcd3" / "package.json").is_file():
        pytest.fail(
            f"npm etcd3 not installed in {base}: scripts/python-tests.sh runs `npm ci` there "
            "(or set NPM_ETCD3_DIR to a directory with its node_modules)"
        )
    return base


def run_node(side: Side, modules: Path) -> Dict[str, Any]:
    # Debian's node, the file scripts/deps.sh checks (`$NODE_BIN` to run another).
    node = os.environ.get("NODE_BIN") or "/usr/bin/node"
    if not os.access(node, os.X_OK):
        pytest.fail(f"no node at {node} (scripts/deps.sh installs nodejs)")
    done = subprocess.run(
        [node, str(NPM_DIR / "cases.js"), side.url],
        env={**os.environ, "NODE_PATH": str(modules / "node_modules")},
        capture_output=True,
        timeout=NODE_TIMEOUT,
        text=True,
    )
    assert done.returncode == 0, f"node against {side.name}: {done.returncode}\n{done.stdout}\n{done.stderr}"
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    assert lines and lines[-1] == {"done": True}, done.stdout + done.stderr
    labels = Labels()
    return {line["case"]: normalise_npm({k: v for k, v in line.items() if k != "case"}, labels) for line in lines[:-1]}


def test_npm_etcd3_answers_as_against_etcd(stack: Stack) -> None:
    modules = npm_dir()
    etcd_out, proxy_out = run_sides(stack, lambda side: run_node(side, modules))
    differences = diff("npm-etcd3", etcd_out, proxy_out)
    assert not differences, "npm etcd3 answered differently:\n" + "\n".join(differences)
    # The cases ran (an error on both sides would compare equal).
    assert all("error" not in v for v in etcd_out.values()), etcd_out
    assert etcd_out["lock"]["out"]["contended"]["is_lock_failed"] is True
    assert etcd_out["watch"]["out"]["progress_notified"] is True
    assert etcd_out["election"]["out"]["bob_elected_after_resign"] is True
