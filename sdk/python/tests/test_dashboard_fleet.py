"""The dashboard's fleet panel (``/ui?fleet=…``) in headless Chromium, as test_dashboard.py drives
the rest of the page (its helpers, and a browser of this module's own).

Members join a fleet through the API while the page shows it: the first gets everything, the
second its share through hand-offs (listed with their time left until the old holder releases),
a member that writes on after its resource moved is refused by the enforcer (marked on the
timeline), and a fleet with no live member leaves its resources unowned (a gap on every lane).
``UI_FLEET_SCREENSHOT=path`` saves the screenshot of a busy fleet there, after a longer run
(docs/ui-fleet.png is one); by default a short run's goes to the work dir.
"""

import os
import time
import uuid
from pathlib import Path
from typing import Dict, Iterator, List

import httpx
import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from conftest import Etcd
from test_dashboard import (  # noqa: F401 (browser, enforced, tenants: fixtures used here)
    SHOWN_WITHIN,
    browser,
    console_errors,
    enforced,
    shown,
    tenants,
)


def put_fleet(url: str, fleet: str, resources: List[str], token: str = "", **spec) -> None:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    r = httpx.put(f"{url}/v1/fleets/{fleet}", json={"resources": resources, **spec}, headers=headers)
    assert r.status_code == 200, r.text


def join(url: str, fleet: str, member: str, ttl: int = 30, token: str = "") -> dict:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    r = httpx.post(f"{url}/v1/fleets/{fleet}/members", json={"member": member, "ttl_seconds": ttl}, headers=headers)
    assert r.status_code == 201, r.text
    return r.json()


def assignment(url: str, fleet: str, joined: dict) -> dict:
    r = httpx.get(f"{url}/v1/fleets/{fleet}/members/{joined['member']}", headers={"lease-secret": joined["secret"]})
    assert r.status_code == 200, r.text
    return r.json()


def leave(url: str, joined: dict, token: str = "") -> None:
    headers = {"lease-secret": joined["secret"], **({"authorization": f"Bearer {token}"} if token else {})}
    r = httpx.delete(f"{url}/v1/sessions/{joined['session_id']}", headers=headers)
    assert r.status_code == 204, r.text


def open_fleet(driver, url: str, fleet: str) -> None:
    driver.get(f"{url}/ui?fleet={fleet}")
    WebDriverWait(driver, 10).until(lambda d: d.find_element(By.ID, "fleet-state").text == "live")


def members(driver) -> Dict[str, dict]:
    """The members table: member -> {state, weight, held: [resource]} (read in one step)."""
    rows = driver.execute_script(
        "return [...document.querySelectorAll('#fleet-members tbody tr')].map(tr => [tr.dataset.member,"
        " tr.cells[1].textContent, tr.cells[2].textContent, tr.dataset.held])")  # fmt: skip
    return {m: {"state": s, "weight": int(w), "held": sorted(h.split(",")) if h else []} for m, s, w, h in rows}


def handoffs(driver) -> Dict[str, tuple]:
    """The hand-offs table: resource -> (from, time left as shown)."""
    rows = driver.execute_script(
        "return [...document.querySelectorAll('#fleet-handoffs tbody tr')].map(tr => [tr.dataset.resource,"
        " tr.dataset.member, tr.querySelector('.left').textContent])")  # fmt: skip
    return {r: (m, left) for r, m, left in rows}


def unowned(driver) -> List[str]:
    names = driver.find_element(By.ID, "fleet-unassigned").get_attribute("data-resources")
    return sorted(names.split(",")) if names else []


def lane(driver, resource: str) -> dict:
    """What the page knows of `resource`'s lane: its stretches (holder, or None: nobody) and marks."""
    return driver.execute_script(
        "const l = fleet.lanes.get(arguments[0]); return l && {segs: l.segs.map(s => ({holder: s.holder,"
        " from: s.from, to: s.to, releasing: s.releasing})), marks: l.marks.map(m => m.kind)}", resource)  # fmt: skip


def pixel(driver, resource: str, at: float) -> List[int]:
    """The timeline's colour at `resource`'s lane, at the page's moment `at`, drawn afresh."""
    return driver.execute_script(
        "const c = document.getElementById('fleet-lanes'), now = performance.now(); lanes.dirty = true;"
        " drawLanes(now); const g = laneGeometry(c), i = fleet.resources.indexOf(arguments[0]);"
        " const x = g.labels + (arguments[1] - (now - fleet.windowMs)) / fleet.windowMs * g.plot;"
        " const y = LANE_AXIS_PX + i * g.height + g.height / 2, dpr = window.devicePixelRatio || 1;"
        " return [...c.getContext('2d').getImageData(Math.round(x * dpr), Math.round(y * dpr), 1, 1).data]"
        " .slice(0, 3)", resource, at)  # fmt: skip


def css_colour(driver, name: str) -> List[int]:
    hex_ = driver.execute_script(f"return getComputedStyle(document.documentElement).getPropertyValue('{name}')")
    hex_ = hex_.strip().lstrip("#")
    return [int(hex_[i : i + 2], 16) for i in (0, 2, 4)]


def like(drawn: List[int], colour: List[int]) -> bool:
    """The same colour, but for the canvas's rounding."""
    return all(abs(a - b) <= 3 for a, b in zip(drawn, colour))


def test_members_joining_a_hand_off_a_refused_write_and_a_gap_are_on_the_fleet_panel(enforced, browser) -> None:
    proxy, gateway = enforced["proxy"], enforced["gateway"]
    name = f"ui-fleet-{uuid.uuid4().hex[:6]}"
    resources = [f"{name}-aisle-{i}" for i in range(1, 7)]
    # Long enough a drain for the page to show the hand-offs before they are released.
    put_fleet(proxy, name, resources, drain_ms=30_000)
    open_fleet(browser, proxy, name)
    shown(browser, lambda d: unowned(d) == sorted(resources), SHOWN_WITHIN, "the resources are not shown unowned")
    assert members(browser) == {}

    a = join(proxy, name, "robot-a")
    shown(browser, lambda d: members(d).get("robot-a", {}).get("held") == sorted(resources), 5, "a holds nothing")
    assert unowned(browser) == [] and members(browser)["robot-a"]["state"] == "active"
    old = {g["resource"]: g for g in assignment(proxy, name, a)["held"]}  # a's tokens
    b = join(proxy, name, "robot-b")
    # Three move to b: a hands them off (releasing, the time left counting down from 30 s).
    shown(browser, lambda d: len(handoffs(d)) == 3, 5, "no hand-off shown")
    moving = sorted(handoffs(browser))
    assert {m for m, _ in handoffs(browser).values()} == {"robot-a"}
    assert all(left.startswith("≤ ") and 25 < float(left[2:-2]) <= 30 for _, left in handoffs(browser).values())
    assert members(browser)["robot-a"]["held"] == sorted(set(resources) - set(moving))
    assert members(browser)["robot-b"]["held"] == []
    # a writes one more count under its old token, then releases; b's grant raises the mark, so
    # a's next write under that token is refused.
    moved = moving[0]
    write = lambda token: httpx.put(f"{gateway}/count", content=b"7", headers={  # noqa: E731
        "fencing-token": token, "fencing-resource": moved})  # fmt: skip
    assert write(old[moved]["fencing_token"]).status_code == 200
    for r in moving:
        assert httpx.delete(f"{proxy}/v1/leases/{r}", headers={"lease-secret": a["secret"]}).status_code == 204
    took = shown(browser, lambda d: handoffs(d) == {} and members(d)["robot-b"]["held"] == moving, 5,
                 "the hand-offs did not complete")  # fmt: skip
    segs = lane(browser, moved)["segs"]
    assert [s["holder"] for s in segs] == [None, "robot-a", None, "robot-b"], segs
    assert segs[1]["releasing"] is not None and "moved" in lane(browser, moved)["marks"]
    assert write(old[moved]["fencing_token"]).status_code == 409
    shown(browser, lambda d: "refused" in lane(d, moved)["marks"], SHOWN_WITHIN + 1.0, "the refusal is not marked")

    # Nobody left: every resource is unowned until c joins — a gap on every lane. Told by the
    # poll alone (the stream's events dropped meanwhile): an answer read at the revision of
    # the ends makes their events moot, so a member gone from it with its grants is no holder
    # any more — not someone holding them "outside the fleet".
    browser.execute_script("window.realFleetEvent = fleetEvent; fleetEvent = () => {}")
    leave(proxy, a)
    leave(proxy, b)
    shown(browser, lambda d: unowned(d) == sorted(resources), 5, "the resources are still shown held")
    browser.execute_script("fleetEvent = window.realFleetEvent")
    gap_started = browser.execute_script("return performance.now()")
    time.sleep(1.5)
    c = join(proxy, name, "robot-c")
    shown(browser, lambda d: members(d).get("robot-c", {}).get("held") == sorted(resources), 5, "c holds nothing")
    shown(browser, lambda d: set(members(d)) == {"robot-c"}, 3, "the members who left are still listed")
    last = lane(browser, resources[0])["segs"]
    assert [s["holder"] for s in last[-2:]] == [None, "robot-c"], last
    gap = last[-2]
    assert gap["to"] - gap["from"] >= 1000, gap
    # Drawn: the gap in its colour, c's stretch in c's.
    assert like(pixel(browser, resources[0], (gap["from"] + gap["to"]) / 2), css_colour(browser, "--gap"))
    c_colour = browser.execute_script("return fleet.colours.get('robot-c')")
    time.sleep(1.5)  # a few pixels of c's stretch, away from its edges
    now = browser.execute_script("return performance.now()")
    assert like(pixel(browser, resources[0], now - 800), css_colour(browser, f"--h{c_colour}"))
    assert gap_started <= gap["from"] + 1000
    print(f"a completed hand-off showed {took * 1000:.0f} ms after its release answered")
    for robot in take_screenshot(browser, proxy, gateway, name, resources, c):
        leave(proxy, robot)
    assert console_errors(browser) == []


def test_a_fleet_of_hundreds_of_resources_polls_and_draws_within_bounds(enforced, browser) -> None:
    proxy = enforced["proxy"]
    name = f"ui-big-{uuid.uuid4().hex[:6]}"
    resources = [f"{name}-r{i:03}" for i in range(300)]
    # Passive members (they never release): moves complete at once, all at once.
    put_fleet(proxy, name, resources, drain_ms=0, max_moves=300)
    joined = [join(proxy, name, f"robot-{i}") for i in range(4)]
    try:
        open_fleet(browser, proxy, name)
        shown(browser, lambda d: unowned(d) == [] and len(members(d)) == 4, 15, "not all assigned")
        assert sorted(len(m["held"]) for m in members(browser).values()) == [75, 75, 75, 75]
        # One draw of 300 lanes fits in a frame; the poll stays at one a second.
        took = browser.execute_script(
            "const t = performance.now(); for (let i = 0; i < 10; i++) { lanes.dirty = true;"
            " drawLanes(performance.now()); } return (performance.now() - t) / 10")  # fmt: skip
        assert took < 16, f"a draw of 300 lanes took {took:.1f} ms"
        browser.execute_script("performance.setResourceTimingBufferSize(100000); performance.clearResourceTimings()")
        time.sleep(3)
        polls = browser.execute_script(
            "return performance.getEntriesByType('resource').filter(e => e.name.includes('/v1/fleets/')).length")
        assert polls <= 4, f"{polls} reads of the fleet in 3 s"
        height = browser.execute_script("return document.getElementById('fleet-lanes').clientHeight")
        assert height >= 300 * 3, height
        print(f"a draw of 300 lanes took {took:.2f} ms")
    finally:
        for j in joined:
            leave(proxy, j)
    assert console_errors(browser) == []


def test_a_fleet_is_shown_only_to_whom_may_read_it(tenants, browser) -> None:
    url = tenants["url"]
    name = f"alice-fleet-{uuid.uuid4().hex[:4]}"
    put_fleet(url, name, [f"alice-{name}-{i}" for i in range(3)], token=tenants["alice"])
    a = join(url, name, "robot-alice", token=tenants["alice"])
    try:
        browser.get(f"{url}/ui?fleet={name}")
        WebDriverWait(browser, 10).until(lambda d: d.find_element(By.ID, "auth").is_displayed())
        browser.find_element(By.ID, "token").send_keys(tenants["bob"] + "\n")
        shown(browser, lambda d: "not allowed" in d.find_element(By.ID, "fleet-state").text, 5, "not refused")
        source = browser.page_source
        assert "robot-alice" not in source and f"alice-{name}-0" not in source
        assert a["secret"] not in source
        browser.execute_script("sessionStorage.setItem('lease-proxy.token', arguments[0])", tenants["alice"])
        browser.find_element(By.CSS_SELECTOR, "#fleet-form button").click()
        shown(browser, lambda d: members(d).get("robot-alice", {}).get("held") == [f"alice-{name}-{i}" for i in range(3)],
              5, "alice's fleet is not shown to alice")  # fmt: skip
        assert a["secret"] not in browser.page_source
    finally:
        leave(url, a, tenants["alice"])
        browser.execute_script("sessionStorage.clear()")
    # 403: bob may not read alice's fleet (the page says so and tries again later).
    unexpected = [e for e in console_errors(browser) if "/v1/fleets/" not in e or "status of 403" not in e]
    assert unexpected == [], unexpected


def take_screenshot(browser, proxy: str, gateway: str, name: str, resources: List[str], c: dict) -> List[dict]:
    """The fleet panel for docs/ui-fleet.png: with UI_FLEET_SCREENSHOT set, a minute of robots
    joining, handing off, dying, writing late and restarting first, on the timeline's one-minute
    span. Answers the members to leave."""
    target = os.environ.get("UI_FLEET_SCREENSHOT")
    robots = busy_minute(browser, proxy, gateway, name, resources, c) if target else [c]
    browser.set_window_size(1280, 1080)
    browser.execute_script("document.activeElement.blur();"
                           " window.scrollTo(0, document.getElementById('fleet').offsetTop - 10)")
    time.sleep(0.5)
    path = Path(target or Path(os.environ.get("TMPDIR", "/tmp")) / "lease-proxy-ui-fleet.png")
    browser.save_screenshot(str(path))
    browser.set_window_size(1280, 900)
    print(f"screenshot: {path}")
    return robots


def busy_minute(browser, proxy: str, gateway: str, name: str, resources: List[str], c: dict) -> List[dict]:
    browser.find_element(By.CSS_SELECTOR, "#fleet-window option[value='1']").click()
    spare = [f"{name}-aisle-{i}" for i in range(7, 13)]
    # Passive members: what moves is revoked at its deadline, 4 s after the move.
    put_fleet(proxy, name, resources + spare, drain_ms=4_000, max_moves=4)
    time.sleep(4)
    robots = {"robot-c": c}
    for who in ("robot-d", "robot-e"):
        robots[who] = join(proxy, name, who)
        time.sleep(7)
    # e writes on under the tokens of what it hands off to f (as a paused robot would).
    tokens = {g["resource"]: g["fencing_token"] for g in assignment(proxy, name, robots["robot-e"])["held"]}
    robots["robot-f"] = join(proxy, name, "robot-f")
    time.sleep(7)
    for r, token in tokens.items():
        httpx.put(f"{gateway}/count", content=b"7", headers={"fencing-token": token, "fencing-resource": r})
    leave(proxy, robots.pop("robot-d"))  # a death: its resources go to the others
    time.sleep(6)
    # A deploy: c drains, hands everything off, restarts (joins again under its name). The
    # screenshot is taken as g's share is being handed to it, 1.5 s into its 4 s drain.
    httpx.post(f"{proxy}/v1/fleets/{name}/members/robot-c/drain")
    time.sleep(7)
    robots["robot-c"] = join(proxy, name, "robot-c")
    time.sleep(7)
    robots["robot-g"] = join(proxy, name, "robot-g")  # its share on the way: hand-offs in progress
    time.sleep(1.5)
    return list(robots.values())
