"""The dashboard (lease-proxy's /ui) in a real headless Chromium, driven through chromedriver
(Debian's chromium and chromium-driver, from scripts/deps.sh): one browser for every case.

Leases are taken and released through the API with httpx while the page shows them; a relay in
front of the proxy drops the page's event stream to see it resume. ``UI_SCREENSHOT=path`` saves
the screenshot of a busy page there (docs/ui.png is one); by default it goes to the work dir.

One browser serves every case.
"""

import contextlib
import hashlib
import os
import secrets
import subprocess
import time
import uuid
from pathlib import Path
from typing import Iterator, List

import httpx
import pytest
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import WebDriverWait

from conftest import Etcd, Relay, free_port, proxy_binary, stop, wait_until

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
# How soon a change made through the API must show: the "within 1 s".
SHOWN_WITHIN = 1.0


@pytest.fixture(scope="module")
def browser() -> Iterator[webdriver.Chrome]:
    for path in (CHROMIUM, CHROMEDRIVER):
        if not os.access(path, os.X_OK):
            pytest.fail(f"no {path}: scripts/deps.sh installs chromium and chromium-driver")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1280,900", "--no-first-run", "--disable-extensions"):
        options.add_argument(arg)  # fmt: skip
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(20)
    try:
        yield driver
    finally:
        driver.quit()


def console_errors(driver: webdriver.Chrome) -> List[str]:
    """Errors on the console since the last call: every script error, and every failed request
    but the answers the page expects and handles (401: asks for a token; 404: a grant that
    ended while its time left was being read; 410: a resume point compacted, listed again)."""
    def handled(e: dict) -> bool:
        m = e["message"]
        return e.get("source") == "network" and (
            "status of 401" in m or "status of 410" in m or ("/v1/leases/" in m and "status of 404" in m))
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE" and not handled(e)]  # fmt: skip


def open_page(driver: webdriver.Chrome, url: str) -> None:
    driver.get(url)
    WebDriverWait(driver, 10).until(lambda d: d.find_element(By.ID, "stream").text.startswith("live"))


def row(driver: webdriver.Chrome, resource: str):
    """`resource`'s row in the held table, or None; looked up in one step inside the page, since
    the table is rendered once per frame and a row listed a moment ago may be gone by now."""
    return driver.execute_script(
        "return [...document.querySelectorAll('#held tbody tr')].find(tr => tr.dataset.resource === arguments[0])"
        " ?? null", resource)  # fmt: skip


def events(driver: webdriver.Chrome, resource: str) -> List[str]:
    """The timeline's kinds for `resource`, oldest first."""
    return driver.execute_script(
        "return [...document.querySelectorAll('#timeline li')].filter(li => li.dataset.resource === arguments[0])"
        ".map(li => li.querySelector('.kind').textContent).reverse()", resource)  # fmt: skip


def time_left(driver: webdriver.Chrome, resource: str) -> float:
    return float(row(driver, resource).find_element(By.TAG_NAME, "progress").get_attribute("value"))


def shown(driver: webdriver.Chrome, check, within: float, what: str) -> float:
    """Waits for `check(driver)`; how long it took."""
    started = time.monotonic()
    WebDriverWait(driver, within, poll_frequency=0.02, ignored_exceptions=(StaleElementReferenceException,)).until(
        check, message=what)  # fmt: skip
    return time.monotonic() - started


def acquire(url: str, resource: str, holder: str, ttl: int, token: str = "") -> dict:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    r = httpx.post(f"{url}/v1/leases/{resource}", json={"holder": holder, "ttl_seconds": ttl}, headers=headers)
    assert r.status_code == 201, r.text
    return r.json()


def release(url: str, resource: str, grant: dict, token: str = "") -> None:
    headers = {"lease-secret": grant["secret"]}
    if token:
        headers["authorization"] = f"Bearer {token}"
    assert httpx.delete(f"{url}/v1/leases/{resource}", headers=headers).status_code == 204


def test_the_page_is_self_contained_and_loads_without_console_errors(proxy: str, browser) -> None:
    page = httpx.get(f"{proxy}/ui")
    assert page.status_code == 200
    assert page.headers["content-type"] == "text/html; charset=utf-8"
    csp = page.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "script-src 'self'" in csp and "unsafe-inline" not in csp
    assert page.headers["x-content-type-options"] == "nosniff"
    assert "<script>" not in page.text and " style=" not in page.text  # nothing inline
    for asset, media in (("app.js", "text/javascript"), ("app.css", "text/css"), ("favicon.svg", "image/svg+xml")):
        r = httpx.get(f"{proxy}/ui/{asset}")
        assert (r.status_code, r.headers["content-type"].split(";")[0]) == (200, media)
        text = r.text.replace('xmlns="http://www.w3.org/2000/svg"', "")  # a name, not a request
        assert "http://" not in text and "https://" not in text, f"{asset} names another origin"
    for name in ("nothing.js", "%2e%2e%2fopenapi.json", "app.js%00", "APP.JS"):
        assert httpx.get(f"{proxy}/ui/{name}").status_code == 404, name  # only the embedded files
    open_page(browser, f"{proxy}/ui?prefix=nothing-{uuid.uuid4().hex[:6]}")
    WebDriverWait(browser, 10).until(lambda d: d.find_element(By.ID, "ready").text.startswith("ready"))
    assert browser.find_element(By.ID, "held-empty").is_displayed()
    assert console_errors(browser) == []


def test_a_lease_appears_counts_down_and_its_release_moves_it_to_the_timeline(proxy: str, browser) -> None:
    prefix = f"ui-{uuid.uuid4().hex[:6]}-"
    open_page(browser, f"{proxy}/ui?prefix={prefix}")
    resource = prefix + "aisle-1"
    grant = acquire(proxy, resource, "robot-a", 30)
    took = shown(browser, lambda d: row(d, resource) is not None, SHOWN_WITHIN, "the grant did not show")
    cells = [c.text for c in row(browser, resource).find_elements(By.TAG_NAME, "td")]
    assert cells[:4] == [resource, "robot-a", "—", grant["token"]], cells
    assert grant["secret"] not in browser.page_source
    # The bar counts down on the browser's clock from etcd's remaining TTL (re-read every
    # second, in whole seconds: it may step up by less than a second, never by more).
    WebDriverWait(browser, 5).until(lambda d: time_left(d, resource) > 0)
    first = time_left(browser, resource)
    assert 26_000 <= first <= 30_000, first
    time.sleep(2.5)
    later = time_left(browser, resource)
    assert later < first - 1_000, (first, later)
    release(proxy, resource, grant)
    shown(browser, lambda d: row(d, resource) is None, SHOWN_WITHIN, "the released grant is still shown")
    assert events(browser, resource) == ["acquired", "released"]
    # Its tokens: the resource's history, opened from the timeline's name.
    again = acquire(proxy, resource, "robot-b", 30)
    shown(browser, lambda d: row(d, resource) is not None, SHOWN_WITHIN, "the second grant did not show")
    row(browser, resource).find_element(By.TAG_NAME, "button").click()
    history = browser.find_element(By.ID, "history-list").text
    assert f"token {again['token']} · robot-b" in history and f"token {grant['token']} · robot-a" in history
    release(proxy, resource, again)
    print(f"a grant showed {took * 1000:.0f} ms after its acquire answered")
    assert console_errors(browser) == []


def test_an_expiry_shows_as_expired_and_the_next_holder_as_taking_over(proxy: str, browser) -> None:
    prefix = f"ui-{uuid.uuid4().hex[:6]}-"
    open_page(browser, f"{proxy}/ui?prefix={prefix}")
    resource = prefix + "dock"
    acquire(proxy, resource, "robot-stalled", 2)  # never renewed
    shown(browser, lambda d: row(d, resource) is not None, SHOWN_WITHIN, "the grant did not show")
    shown(browser, lambda d: events(d, resource)[-1:] == ["expired"], 10, "the expiry did not show")
    # The timeline is written as the event arrives, the table at the next frame.
    shown(browser, lambda d: row(d, resource) is None, 1, "the expired grant is still shown")
    taker = acquire(proxy, resource, "robot-next", 30)
    shown(browser, lambda d: events(d, resource)[-1:] == ["taken over"], SHOWN_WITHIN, "no take-over")
    release(proxy, resource, taker)


def test_the_time_left_text_never_exceeds_the_ttl_as_the_bar_does_not(proxy: str, browser) -> None:
    prefix = f"ui-{uuid.uuid4().hex[:6]}-"
    open_page(browser, f"{proxy}/ui?prefix={prefix}")
    resource = prefix + "capped"
    # A read of the grant answering more time than its TTL (a lease counted from after the
    # request arrived, etcd's whole-second rounding): the page's fetch is wrapped to say so.
    browser.execute_script(
        "const real = window.fetch; window.fetch = async (path, init) => { const r = await real(path, init);"
        " if (!String(path).endsWith('/' + arguments[0]) || !r.ok) return r; const body = await r.json();"
        " body.expires_in_ms = Number(body.ttl_seconds) * 10000; return new Response(JSON.stringify(body),"
        " {status: 200, headers: {'content-type': 'application/json'}}); };", resource)  # fmt: skip
    grant = acquire(proxy, resource, "robot-a", 5)
    text = lambda d: row(d, resource).find_element(By.CLASS_NAME, "left").text  # noqa: E731
    shown(browser, lambda d: row(d, resource) is not None and text(d).endswith(" s"), 5, "no time left")
    assert float(text(browser).removesuffix(" s")) <= 5.0, text(browser)
    assert time_left(browser, resource) <= 5_000
    release(proxy, resource, grant)
    assert console_errors(browser) == []


def test_a_dropped_stream_resumes_without_losing_or_repeating_an_event(proxy: str, browser) -> None:
    relay = Relay(int(proxy.rsplit(":", 1)[1]))
    try:
        prefix = f"ui-{uuid.uuid4().hex[:6]}-"
        open_page(browser, f"{relay.url}/ui?prefix={prefix}")
        a, b = prefix + "a", prefix + "b"
        grant_a = acquire(proxy, a, "robot-a", 30)
        shown(browser, lambda d: row(d, a) is not None, SHOWN_WITHIN, "a did not show")
        # The page's connections go away; what happens meanwhile reaches it only by resuming.
        relay.cut(block=True)
        grant_b = acquire(proxy, b, "robot-b", 30)
        release(proxy, a, grant_a)
        relay.blocked = False
        shown(browser, lambda d: "resumed" in d.find_element(By.ID, "stream").text, 10, "no resume")
        shown(browser, lambda d: row(d, b) is not None and row(d, a) is None, 5, "the gap was lost")
        assert events(browser, a) == ["acquired", "released"]
        assert events(browser, b) == ["acquired"]
        release(proxy, b, grant_b)
        shown(browser, lambda d: events(d, b) == ["acquired", "released"], SHOWN_WITHIN, "b's release")
        # The cut stream is the one failed request on the console.
        assert all("/v1/watch" in e and "net::ERR_" in e for e in console_errors(browser))
    finally:
        relay.close()


def test_a_narrow_window_and_the_keyboard_reach_everything(proxy: str, browser) -> None:
    prefix = f"ui-{uuid.uuid4().hex[:6]}-"
    hostile = '<img src=x onerror="document.title=1">robot-with-a-long-name'
    grant = acquire(proxy, prefix + "narrow", hostile, 30)
    try:
        browser.set_window_size(360, 740)
        open_page(browser, f"{proxy}/ui?prefix={prefix}")
        shown(browser, lambda d: row(d, prefix + "narrow") is not None, 5, "not listed")
        # Names are text, never markup.
        assert row(browser, prefix + "narrow").find_elements(By.TAG_NAME, "td")[1].text == hostile
        assert browser.find_elements(By.CSS_SELECTOR, "main img") == [] and browser.title == "lease-proxy"
        overflow = browser.execute_script(
            "return document.documentElement.scrollWidth - document.documentElement.clientWidth")
        assert overflow <= 0, f"the page is {overflow} px wider than a narrow window"  # fmt: skip
        # Every input has its label; Tab moves from the prefix field to its button.
        for field in browser.find_elements(By.CSS_SELECTOR, "input"):
            fid = field.get_attribute("id")
            assert browser.find_elements(By.CSS_SELECTOR, f"label[for='{fid}']"), f"#{fid} has no label"
        prefix_field = browser.find_element(By.ID, "prefix")
        prefix_field.click()
        prefix_field.send_keys(Keys.TAB)
        assert browser.switch_to.active_element.text == "Show"
        bar = row(browser, prefix + "narrow").find_element(By.TAG_NAME, "progress")
        assert bar.get_attribute("aria-label") == f"Time left for {prefix}narrow"
    finally:
        browser.set_window_size(1280, 900)
        release(proxy, prefix + "narrow", grant)


@contextlib.contextmanager
def fenced_stack(workdir: Path, etcd: Etcd, key_file: Path, upstream, name: str, proxy_args: List[str]):
    """fence-gateway (header mode, memory store, in front of `upstream`) and a lease-proxy
    pre-fencing at it and showing its feed (`--ui-gateway`), with `proxy_args` (GATEWAY: its
    URL); yields their URLs."""
    proxy, gateway = (f"http://127.0.0.1:{free_port()}" for _ in range(2))
    gateway_bin = os.environ.get("FENCE_GATEWAY_BIN") or str(Path(proxy_binary()).with_name("fence-gateway"))
    logs = (workdir / f"{name}-gateway.log", workdir / f"{name}-proxy.log")
    processes = [
        subprocess.Popen(
            [gateway_bin, "--listen", gateway[7:], "--upstream", upstream.url, "--store", "memory",
             "--key-file", str(key_file)],
            stdout=logs[0].open("wb"), stderr=subprocess.STDOUT,
        ),
        subprocess.Popen(
            [proxy_binary(), "--listen", proxy[7:], "--etcd-endpoints", etcd.url,
             "--etcd-prefix", f"/lease-proxy-py-{name}/", "--key-file", str(key_file),
             "--data-dir", str(workdir / f"{name}-proxy"), "--prefence-url", gateway, "--ui-gateway", gateway,
             *(gateway if a == "GATEWAY" else a for a in proxy_args)],
            stdout=logs[1].open("wb"), stderr=subprocess.STDOUT,
        ),
    ]  # fmt: skip
    try:
        for url, log in zip((gateway, proxy), logs):
            wait_until(lambda: httpx.get(f"{url}/readyz", timeout=1).status_code == 200, 30, url, log)
        yield proxy, gateway
    finally:
        for p in processes:
            stop(p)


def reads_per_second(driver: webdriver.Chrome, prefix: str, seconds: float) -> float:
    """How many `GET /v1/leases/{r}` under `prefix` the page makes a second, over `seconds`."""
    driver.execute_script("performance.setResourceTimingBufferSize(100000); performance.clearResourceTimings()")
    time.sleep(seconds)
    names = driver.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
    return sum(1 for n in names if f"/v1/leases/{prefix}" in n) / seconds


def resync(driver: webdriver.Chrome, relay: Relay, proxy: str, etcd: Etcd, name: str, count: int) -> None:
    """Makes the page's stream resume from a compacted point: the relay drops and holds it
    while `name` is acquired and released and etcd compacted, so the resume is 410 and the page
    starts a fresh stream and lists again; waits for its `count`th resync."""
    relay.cut(block=True)
    release(proxy, name, acquire(proxy, name, "robot", 60))
    etcd.compact()
    relay.blocked = False
    shown(driver, lambda d: events(d, "")[-1:] == ["resynced"] and len(events(d, "")) == count, 10, "no resync")


def listed_again(driver: webdriver.Chrome) -> bool:
    """The fresh stream has its first message (the next resume point) and its list is done:
    only then does a cut make the next resume a 410 (read off the page's state)."""
    return driver.execute_script("return state.lastId !== null && state.listing === null")


def test_resyncs_and_many_rows_keep_the_pages_reads_bounded(proxy: str, etcd: Etcd, browser) -> None:
    relay = Relay(int(proxy.rsplit(":", 1)[1]))
    prefix = f"ui-{uuid.uuid4().hex[:6]}-"
    grants = {}
    try:
        for i in range(3):
            grants[f"{prefix}r{i}"] = acquire(proxy, f"{prefix}r{i}", "robot", 60)
        open_page(browser, f"{relay.url}/ui?prefix={prefix}")
        shown(browser, lambda d: all(row(d, r) is not None for r in grants), 5, "not listed")
        # Three times: the stream drops, etcd compacts past where it was, so its resume is 410
        # and the page lists again (each resync once started one more refresh loop).
        for round in range(3):
            resync(browser, relay, proxy, etcd, f"{prefix}gone-{round}", round + 1)
            shown(browser, listed_again, 10, "not listed again")
        rate = reads_per_second(browser, prefix, 3)
        assert rate <= 2 * len(grants), f"{rate:.1f} reads a second of {len(grants)} held rows"
        # Beyond 200 rows every row is still read (round robin), at most 200 reads a second.
        more = {f"{prefix}m{i:03}": None for i in range(210)}
        for name in more:
            grants[name] = acquire(proxy, name, "robot", 60)
        left = lambda d: d.execute_script(  # noqa: E731
            "return [...document.querySelectorAll('#held tbody tr .left')].map(e => e.textContent)")  # fmt: skip
        shown(browser, lambda d: len(left(d)) == len(grants) and "…" not in left(d), 10, "a row was never read")
        rate = reads_per_second(browser, prefix, 3)
        assert rate <= 210, f"{rate:.1f} reads a second"
    finally:
        relay.close()
        for name, grant in grants.items():
            release(proxy, name, grant)
    unexpected = [e for e in console_errors(browser) if "net::ERR_" not in e]  # the cut and blocked connections'
    assert unexpected == [], unexpected


def test_a_list_superseded_by_a_later_resync_changes_nothing(proxy: str, etcd: Etcd, browser) -> None:
    """Two lists under way at once: the first fresh stream's list still retrying when a second
    410 starts another (CI saw it: "waiting is not iterable", and the older list's snapshot could
    overwrite events applied since). The page's lists fail while their URL is blocked in the
    browser, so both retry until it is let through."""
    relay = Relay(int(proxy.rsplit(":", 1)[1]))
    prefix = f"ui-{uuid.uuid4().hex[:6]}-"
    kept = acquire(proxy, f"{prefix}kept", "robot", 60)
    late = None
    try:
        open_page(browser, f"{relay.url}/ui?prefix={prefix}")
        shown(browser, lambda d: row(d, f"{prefix}kept") is not None, 5, "not listed")
        console_errors(browser)  # from here on
        browser.execute_cdp_cmd("Network.enable", {})
        browser.execute_cdp_cmd("Network.setBlockedURLs", {"urls": ["*/v1/leases?*"]})
        resync(browser, relay, proxy, etcd, f"{prefix}gone-0", 1)
        shown(browser, lambda d: d.execute_script("return state.lastId !== null && state.listing !== null"), 10,
              "the first list is not retrying")  # fmt: skip
        resync(browser, relay, proxy, etcd, f"{prefix}gone-1", 2)
        shown(browser, lambda d: d.execute_script("return state.lastId !== null"), 10, "no second stream")
        late = acquire(proxy, f"{prefix}late", "robot", 60)  # queued for the second list
        time.sleep(0.5)
        browser.execute_cdp_cmd("Network.setBlockedURLs", {"urls": []})
        shown(browser, listed_again, 10, "not listed again")
        time.sleep(2.0)  # the first list retries a second apart: it has come back too
        assert row(browser, f"{prefix}kept") is not None and row(browser, f"{prefix}late") is not None
        assert [n for n in ("gone-0", "gone-1") if row(browser, prefix + n) is not None] == []
    finally:
        browser.execute_cdp_cmd("Network.setBlockedURLs", {"urls": []})
        relay.close()
        release(proxy, f"{prefix}kept", kept)
        if late:
            release(proxy, f"{prefix}late", late)
    unexpected = [e for e in console_errors(browser) if "net::ERR_" not in e]  # blocked lists, cut streams
    assert unexpected == [], unexpected


@pytest.fixture(scope="module")
def tenants(workdir: Path, etcd: Etcd, key_file: Path, upstream) -> Iterator[dict]:
    """A lease-proxy with --auth-tokens (alice and bob each acquire and read their own prefix),
    pre-fencing at a fence-gateway whose feed its dashboard shows."""
    alice, bob = secrets.token_hex(16), secrets.token_hex(16)
    tokens = workdir / "ui-tokens"
    digest = lambda t: hashlib.sha256(t.encode()).hexdigest()  # noqa: E731
    tokens.write_text(f"alice {digest(alice)} acquire:alice-,read:alice-\nbob {digest(bob)} acquire:bob-,read:bob-\n")
    with fenced_stack(workdir, etcd, key_file, upstream, "ui-tenants", ["--auth-tokens", str(tokens)]) as (url, _):
        yield {"url": url, "alice": alice, "bob": bob}


def test_with_authentication_the_page_asks_for_a_token_and_shows_only_its_principals(tenants, browser) -> None:
    url = tenants["url"]
    mine = acquire(url, "alice-shelf", "robot-alice", 30, tenants["alice"])
    theirs = acquire(url, "bob-shelf", "robot-bob", 30, tenants["bob"])
    try:
        browser.get(f"{url}/ui")
        WebDriverWait(browser, 10).until(lambda d: d.find_element(By.ID, "auth").is_displayed())
        assert browser.switch_to.active_element.get_attribute("id") == "token"
        field = browser.find_element(By.ID, "token")
        field.send_keys("not-a-token", Keys.ENTER)
        WebDriverWait(browser, 10).until(lambda d: "refused" in d.find_element(By.ID, "auth-why").text)
        field.send_keys(tenants["alice"], Keys.ENTER)
        WebDriverWait(browser, 10).until(lambda d: d.find_element(By.ID, "stream").text.startswith("live"))
        shown(browser, lambda d: row(d, "alice-shelf") is not None, 5, "alice's lease is not shown")
        assert row(browser, "bob-shelf") is None
        # Bob's activity never reaches alice's page, and no secret is ever on it.
        bob_next = acquire(url, "bob-dock", "robot-bob", 30, tenants["bob"])
        alice_next = acquire(url, "alice-dock", "robot-alice", 30, tenants["alice"])
        shown(browser, lambda d: row(d, "alice-dock") is not None, SHOWN_WITHIN, "alice's second lease")
        # The enforcer's marks (raised by every grant's pre-fence): alice's only.
        WebDriverWait(browser, 5).until(
            lambda d: {r.get_attribute("data-resource") for r in d.find_elements(By.CSS_SELECTOR, "#marks tbody tr")}
            == {"alice-shelf", "alice-dock"})  # fmt: skip
        relayed = httpx.get(f"{url}/ui/enforcer", headers={"authorization": f"Bearer {tenants['bob']}"}).json()
        assert {m["resource"] for m in relayed["marks"]} == {"bob-shelf", "bob-dock"}, relayed
        assert httpx.get(f"{url}/ui/enforcer").status_code == 401
        source = browser.page_source
        assert "bob-" not in source and "robot-bob" not in source
        for grant in (mine, theirs, bob_next, alice_next):
            assert grant["secret"] not in source
        assert browser.execute_script("return sessionStorage.getItem('lease-proxy.token')") == tenants["alice"]
        assert browser.execute_script("return localStorage.length") == 0
        release(url, "bob-dock", bob_next, tenants["bob"])
        release(url, "alice-dock", alice_next, tenants["alice"])
        # The token stops working (revoked); the next principal to sign in on this tab sees
        # nothing of alice's (her events once stayed on bob's page).
        browser.execute_script("sessionStorage.setItem('lease-proxy.token', 'revoked')")
        browser.find_element(By.CSS_SELECTOR, "#filter button[type=submit]").click()
        WebDriverWait(browser, 10).until(lambda d: d.find_element(By.ID, "auth").is_displayed())
        assert browser.execute_script("return sessionStorage.getItem('lease-proxy.token')") is None
        browser.find_element(By.ID, "token").send_keys(tenants["bob"], Keys.ENTER)
        shown(browser, lambda d: row(d, "bob-shelf") is not None, 5, "bob's lease is not shown")
        source = browser.page_source
        assert "alice-" not in source and "robot-alice" not in source and "robot-rescue" not in source
        browser.find_element(By.ID, "sign-out").click()
        WebDriverWait(browser, 10).until(lambda d: d.find_element(By.ID, "auth").is_displayed())
    finally:
        release(url, "alice-shelf", mine, tenants["alice"])
        release(url, "bob-shelf", theirs, tenants["bob"])
    assert console_errors(browser) == []


def take_screenshot(browser, url: str, prefix: str) -> None:
    """A busy page for the README: a few robots' aisles, one stalled and taken over."""
    grants = [(f"{prefix}{i}", acquire(url, f"{prefix}{i}", f"robot-{i}", 10 + 5 * i)) for i in range(1, 5)]
    acquire(url, f"{prefix}9", "robot-stalled", 2)
    shown(browser, lambda d: events(d, f"{prefix}9")[-1:] == ["expired"], 10, "no expiry")
    grants.append((f"{prefix}9", acquire(url, f"{prefix}9", "robot-rescue", 20)))
    shown(browser, lambda d: events(d, f"{prefix}9")[-1:] == ["taken over"], 5, "no take-over")
    release(url, f"{prefix}2", grants.pop(1)[1])
    time.sleep(1.5)
    browser.set_window_size(1280, 1400)
    target = Path(os.environ.get("UI_SCREENSHOT") or Path(os.environ.get("TMPDIR", "/tmp")) / "lease-proxy-ui.png")
    browser.save_screenshot(str(target))
    browser.set_window_size(1280, 900)
    print(f"screenshot: {target}")
    for name, grant in grants:
        release(url, name, grant)


@pytest.fixture(scope="module")
def enforced(workdir: Path, etcd: Etcd, key_file: Path, upstream) -> Iterator[dict]:
    """A lease-proxy forwarding to, pre-fencing at and showing the feed of a fence-gateway
    (header mode, in front of the recording upstream)."""
    with fenced_stack(workdir, etcd, key_file, upstream, "ui-enforced", ["--upstream", "GATEWAY"]) as (proxy, gateway):
        yield {"proxy": proxy, "gateway": gateway}


def refusals(driver: webdriver.Chrome) -> List[tuple]:
    """The enforcer panel's refusals shown, newest first: (reason, resource, text)."""
    return [(li.get_attribute("data-reason"), li.get_attribute("data-resource"), li.text)
            for li in driver.find_elements(By.CSS_SELECTOR, "#refusals li") if li.is_displayed()]  # fmt: skip


def test_the_enforcer_cutting_off_a_replaced_holder_is_on_the_page(enforced, browser) -> None:
    proxy, gateway = enforced["proxy"], enforced["gateway"]
    # The page reaches its own origin only: the proxy relays the gateway's feed.
    csp = httpx.get(f"{proxy}/ui").headers["content-security-policy"]
    assert "connect-src 'self';" in csp, csp
    assert httpx.get(f"{proxy}/ui/config.json").json() == {"enforcer": True}
    for bad in ("after=x", "after=", "after=1&x=2", "before=1", "after=%31"):
        assert httpx.get(f"{proxy}/ui/enforcer?{bad}").status_code == 400, bad
        assert httpx.get(f"{gateway}/fence-gateway/feed?{bad}").status_code == 400, bad

    prefix = f"ui-{uuid.uuid4().hex[:6]}-"
    open_page(browser, f"{proxy}/ui?prefix={prefix}")
    WebDriverWait(browser, 10).until(lambda d: d.find_element(By.ID, "enforcer-state").text == "live")
    resource = prefix + "aisle"
    old = acquire(proxy, resource, "robot-paused", 2)  # pre-fenced: the mark is its token
    write = lambda grant: httpx.put(  # noqa: E731
        f"{gateway}/count", content=b"7",
        headers={"fencing-token": grant["fencing_token"], "fencing-resource": resource})  # fmt: skip
    assert write(old).status_code == 200
    mark = lambda d: [r.text for r in d.find_elements(By.CSS_SELECTOR, "#marks tbody tr")  # noqa: E731
                      if r.get_attribute("data-resource") == resource]  # fmt: skip
    shown(browser, lambda d: mark(d) == [f"{resource} 0:{old['token']}"], 3, "the mark is not shown")
    # The holder stalls past its TTL; the next one's grant raises the mark; the stalled one
    # wakes up and writes.
    shown(browser, lambda d: events(d, resource)[-1:] == ["expired"], 10, "no expiry")
    new = acquire(proxy, resource, "robot-next", 30)
    # A holder's forward never reaches the gateway's feed (the proxy's identity is trusted
    # there; the feed names every tenant's resources).
    for path in ("fence-gateway/feed", "fence-gateway/feed?after=0", "fence-gateway"):
        r = httpx.get(f"{proxy}/v1/leases/{resource}/forward/{path}", headers={"lease-secret": new["secret"]})
        assert r.status_code == 404, (path, r.text)
    late = write(old)
    assert late.status_code == 409, late.text
    took = shown(browser, lambda d: refusals(d)[:1] != [] and refusals(d)[0][0] == "stale", SHOWN_WITHIN + 1.0,
                 "the refusal did not show")  # fmt: skip
    reason, where, text = refusals(browser)[0]
    assert where == resource and f"token 0:{old['token']} below mark 0:{new['token']}" in text, text
    shown(browser, lambda d: mark(d) == [f"{resource} 0:{new['token']}"], 3, "the raised mark is not shown")
    # A forged token and one for another resource are told apart.
    forged = dict(new, fencing_token=new["fencing_token"][:-2] + ("AA" if not new["fencing_token"].endswith("AA") else "BB"))
    assert write(forged).status_code == 401
    shown(browser, lambda d: refusals(d)[0][0] == "forged", SHOWN_WITHIN + 1.0, "no forged refusal")
    # Another prefix's refusals are not shown under this one.
    other = acquire(proxy, "elsewhere-" + prefix, "robot-x", 30)
    httpx.put(f"{gateway}/count", headers={"fencing-token": other["fencing_token"][:-2] + "AA",
                                           "fencing-resource": "elsewhere-" + prefix})  # fmt: skip
    time.sleep(1.5)
    assert all(r[1] == resource for r in refusals(browser))
    take_screenshot(browser, proxy, prefix + "aisle-")
    release(proxy, resource, new)
    release(proxy, "elsewhere-" + prefix, other)
    print(f"a refusal showed {took * 1000:.0f} ms after it was answered")
    assert console_errors(browser) == []
