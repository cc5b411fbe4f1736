"""examples/python/robot.py against the warehouse stack: etcd, lease-proxy forwarding to and
pre-fencing fence-gateway (path mode), the warehouse inventory behind it. With ``--aisles`` the
robot leases aisles itself; by default it joins a fleet, and two robots share its aisles."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator, List

import httpx
import pytest

from conftest import ROOT, Etcd, free_port, stop, take_over, wait_until
from lease_proxy_client import Client

ROBOT = ROOT / "examples" / "python" / "robot.py"


def binary(env: str, name: str) -> str:
    path = os.environ.get(env) or str(ROOT / "target" / "debug" / name)
    if not os.access(path, os.X_OK):
        pytest.fail(f"no {name} at {path}: scripts/python-tests.sh builds it (or set {env})")
    return path


def spawn(args: List[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(args, stdout=log.open("wb"), stderr=subprocess.STDOUT)


@pytest.fixture(scope="module")
def warehouse(workdir: Path, etcd: Etcd, key_file: Path) -> Iterator[dict]:
    """Starts the inventory, fence-gateway and a lease-proxy in front; yields their URLs."""
    inventory, gateway, proxy = (f"http://127.0.0.1:{free_port()}" for _ in range(3))
    processes = [
        spawn(
            [
                binary("WAREHOUSE_BIN", "warehouse"),
                "inventory",
                "--listen",
                inventory[7:],
                "--db",
                f"sqlite:{workdir / 'inventory.db'}",
            ],
            workdir / "inventory.log",
        ),
        spawn(
            [
                binary("FENCE_GATEWAY_BIN", "fence-gateway"),
                "--listen",
                gateway[7:],
                "--upstream",
                inventory,
                "--store",
                f"sqlite:{workdir / 'marks.db'}",
                "--key-file",
                str(key_file),
                "--resource-path",
                "/aisles/{resource}",
                "--write-grace",
                "2s",
            ],
            workdir / "gateway.log",
        ),
    ]
    try:
        wait_until(
            lambda: httpx.get(f"{inventory}/log", timeout=1).status_code == 200,
            30,
            "inventory",
            workdir / "inventory.log",
        )
        wait_until(
            lambda: httpx.get(f"{gateway}/readyz", timeout=1).status_code == 200,
            30,
            "fence-gateway",
            workdir / "gateway.log",
        )
        processes.append(
            spawn(
                [
                    binary("LEASE_PROXY_BIN", "lease-proxy"),
                    "--listen",
                    proxy[7:],
                    "--etcd-endpoints",
                    etcd.url,
                    "--etcd-prefix",
                    "/lease-proxy-py-warehouse/",
                    "--key-file",
                    str(key_file),
                    "--data-dir",
                    str(workdir / "warehouse-proxy"),
                    "--upstream",
                    gateway,
                    "--prefence-url",
                    gateway,
                ],
                workdir / "warehouse-proxy.log",
            )
        )
        wait_until(
            lambda: httpx.get(f"{proxy}/readyz", timeout=1).status_code == 200,
            30,
            "lease-proxy",
            workdir / "warehouse-proxy.log",
        )
        yield {"inventory": inventory, "gateway": gateway, "proxy": proxy}
    finally:
        for p in reversed(processes):
            stop(p)


class Robot:
    """robot.py (or another robot ``script``) as a child process; its ``event`` lines arrive on a queue."""

    def __init__(self, *args: str, script: Path = ROBOT) -> None:
        self.process = subprocess.Popen(
            [sys.executable, str(script), *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self.lines: "queue.Queue[str]" = queue.Queue()
        self.seen: List[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line.rstrip("\n"))

    def expect(self, prefix: str, within: float = 20.0) -> str:
        deadline = time.monotonic() + within
        while True:
            try:
                line = self.lines.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                raise AssertionError(f"no {prefix!r} within {within}s; saw {self.seen}") from None
            self.seen.append(line)
            if line.startswith(prefix):
                return line

    def finish(self, within: float = 30.0) -> List[str]:
        assert self.process.wait(within) == 0, self.seen
        while not self.lines.empty():
            self.seen.append(self.lines.get())
        return self.seen


def writes_by(inventory: str, robot: str) -> list:
    return [w for w in httpx.get(f"{inventory}/log", timeout=10).json() if w["robot"] == robot]


def test_the_robot_counts_aisles_through_the_proxy_with_its_token(warehouse: dict, resource: str) -> None:
    aisles = [f"{resource}-a", f"{resource}-b"]
    robot = Robot(
        "--proxy",
        warehouse["proxy"],
        "--aisles",
        ",".join(aisles),
        "--name",
        resource,
        "--ttl",
        "2",
        "--rounds",
        "3",
        "--updates",
        "2",
        "--count-time",
        "0.1",
    )
    seen = robot.finish()
    acquired = [line.split() for line in seen if line.startswith("event acquired")]
    assert len(acquired) == 3 and sum(line.startswith("event released") for line in seen) == 3, seen
    assert sum(line.startswith("event write-ok") for line in seen) == 6, seen
    writes = writes_by(warehouse["inventory"], resource)
    # every write landed on its aisle with the token of the lease it was made under, in order
    assert [(w["aisle"], w["revision"]) for w in writes] == [
        (a[2], int(a[3])) for a in acquired for _ in range(2)
    ]


def test_a_robot_paused_past_its_ttl_stops_on_loss_without_writing(warehouse: dict, resource: str) -> None:
    robot = Robot(
        "--proxy",
        warehouse["proxy"],
        "--aisles",
        resource,
        "--name",
        resource,
        "--ttl",
        "2",
        "--rounds",
        "1",
        "--updates",
        "40",
        "--count-time",
        "0.2",
    )
    token = int(robot.expect("event acquired").split()[3])
    robot.expect("event write-ok")
    robot.process.send_signal(signal.SIGSTOP)
    try:
        time.sleep(0.3)  # a write in flight when it stopped lands now
        before = len(writes_by(warehouse["inventory"], resource))
        _, grant = take_over(warehouse["proxy"], resource, "usurper", 10, within=20)
        assert int(grant["token"]) > token
    finally:
        robot.process.send_signal(signal.SIGCONT)
    line = robot.expect("event lost")
    assert line.split()[2:] == [resource, "expired"]
    seen = robot.finish()
    assert not any(s.startswith(("event write-ok", "event released")) for s in seen[seen.index(line) :]), seen
    assert len(writes_by(warehouse["inventory"], resource)) == before  # nothing written after the pause


def test_robots_in_a_fleet_share_its_aisles_and_hand_them_over(warehouse: dict, resource: str) -> None:
    # The robot's default: it joins a fleet and counts what the service assigns it, writing
    # straight to fence-gateway with each aisle's token. A long drain deadline: the hand-offs
    # below are the robots' own releases.
    aisles = [f"{resource}-1", f"{resource}-2"]
    with Client(warehouse["proxy"]) as client:
        client.put_fleet(resource, aisles, drain=20)

    def robot(n: str) -> Robot:
        return Robot(
            "--proxy", warehouse["proxy"], "--gateway", warehouse["gateway"], "--fleet", resource,
            "--name", f"{resource}-{n}", "--ttl", "5", "--count-time", "0.05",
        )  # fmt: skip

    first = robot("a")
    first.expect("event joined")
    held = {first.expect("event acquired").split()[2], first.expect("event acquired").split()[2]}
    assert held == set(aisles), first.seen
    first.expect("event write-ok")
    second = robot("b")
    moved = first.expect("event lost").split()
    assert moved[3] == "handed-off", first.seen
    assert second.expect("event acquired").split()[2] == moved[2]
    second.expect(f"event write-ok {moved[2]}")
    # Interrupted, the first robot drains and leaves: its other aisle goes to the second.
    first.process.send_signal(signal.SIGINT)
    seen = first.finish()
    assert seen[-1] == f"event left {resource}", seen
    # It stopped writing the moved aisle the moment it was handed off.
    assert f"event write-ok {moved[2]}" not in seen[seen.index(" ".join(moved)) :], seen
    rest = second.expect("event acquired").split()[2]
    assert {rest, moved[2]} == set(aisles)
    second.expect(f"event write-ok {rest}")
    second.process.send_signal(signal.SIGINT)
    second.finish()
    # Each aisle: the first robot's writes, then the second's, under ever larger tokens.
    log = [w for w in httpx.get(f"{warehouse['inventory']}/log", timeout=10).json() if w["aisle"] in aisles]
    for aisle in aisles:
        writes = [w for w in log if w["aisle"] == aisle]
        revisions = [w["revision"] for w in writes]
        assert revisions == sorted(revisions), writes
        assert writes[0]["robot"] == f"{resource}-a" and writes[-1]["robot"] == f"{resource}-b", writes
