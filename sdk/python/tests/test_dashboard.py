"""The dashboard (lease-proxy's /ui) in a real headless Chromium, driven through chromedriver
(Debian's chromium and chromium-driver, from scripts/deps.sh): one browser for every case.

Leases are taken and released through the API with httpx while the page shows them; a relay in
front of the proxy drops the page's event stream to see it resume. ``UI_SCREENSHOT=path`` saves
the screenshot of a busy page there (docs/ui.png is one); by default it goes to the work dir.
"""

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
    ended while its time left was being read)."""
    handled = ("status of 401", "status of 404")
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"
            and not (e.get("source") == "network" and any(h in e["message"] for h in handled))]  # fmt: skip


def open_page(driver: webdriver.Chrome, url: str) -> None:
    driver.get(url)
    WebDriverWait(driver, 10).until(lambda d: d.find_element(By.ID, "stream").text.startswith("live"))


def row(driver: webdriver.Chrome, resource: str):
    rows = driver.find_elements(By.CSS_SELECTOR, "#held tbody tr")
    return next((r for r in rows if r.get_attribute("data-resource") == resource), None)


def events(driver: webdriver.Chrome, resource: str) -> List[str]:
    """The timeline's kinds for `resource`, oldest first."""
    found = driver.find_elements(By.CSS_SELECTOR, "#timeline li")
    return [li.find_element(By.CSS_SELECTOR, ".kind").text for li in reversed(found)
            if li.get_attribute("data-resource") == resource]  # fmt: skip


def time_left(driver: webdriver.Chrome, resource: str) -> float:
    return float(row(driver, resource).find_element(By.TAG_NAME, "progress").get_attribute("value"))


def shown(driver: webdriver.Chrome, check, within: float, what: str) -> float:
    """Waits for `check(driver)`; how long it took."""
    started = time.monotonic()
    WebDriverWait(driver, within, poll_frequency=0.02).until(check, message=what)
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
    for asset, media in (("app.js", "text/javascript"), ("app.css", "text/css")):
        r = httpx.get(f"{proxy}/ui/{asset}")
        assert (r.status_code, r.headers["content-type"].split(";")[0]) == (200, media)
        assert "http://" not in r.text and "https://" not in r.text, f"{asset} names another origin"
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
    assert row(browser, resource) is None
    taker = acquire(proxy, resource, "robot-next", 30)
    shown(browser, lambda d: events(d, resource)[-1:] == ["taken over"], SHOWN_WITHIN, "no take-over")
    release(proxy, resource, taker)


def test_a_dropped_stream_resumes_without_losing_or_repeating_an_event(proxy: str, browser) -> None:
    relay = Relay(int(proxy.rsplit(":", 1)[1]))
    try:
        prefix = f"ui-{uuid.uuid4().hex[:6]}-"
        open_page(browser, f"{relay.url}/ui?prefix={prefix}")
        a, b = prefix + "a", prefix + "b"
        grant_a = acquire(proxy, a, "robot-a", 30)
        shown(browser, lambda d: row(d, a) is not None, SHOWN_WITHIN, "a did not show")
        # The page's connections go away; what happens meanwhile reaches it only by resuming.
        relay.cut()
        grant_b = acquire(proxy, b, "robot-b", 30)
        release(proxy, a, grant_a)
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


@pytest.fixture(scope="module")
def tenants(workdir: Path, etcd: Etcd, key_file: Path) -> Iterator[dict]:
    """A lease-proxy with --auth-tokens: alice and bob each acquire and read their own prefix."""
    alice, bob = secrets.token_hex(16), secrets.token_hex(16)
    tokens = workdir / "ui-tokens"
    digest = lambda t: hashlib.sha256(t.encode()).hexdigest()  # noqa: E731
    tokens.write_text(f"alice {digest(alice)} acquire:alice-,read:alice-\nbob {digest(bob)} acquire:bob-,read:bob-\n")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = workdir / "ui-proxy.log"
    process = subprocess.Popen(
        [proxy_binary(), "--listen", f"127.0.0.1:{port}", "--etcd-endpoints", etcd.url,
         "--etcd-prefix", "/lease-proxy-py-ui/", "--key-file", str(key_file),
         "--data-dir", str(workdir / "ui-proxy"), "--auth-tokens", str(tokens)],
        stdout=log.open("wb"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        wait_until(lambda: httpx.get(f"{url}/readyz", timeout=1).status_code == 200, 30, "lease-proxy", log)
        yield {"url": url, "alice": alice, "bob": bob}
    finally:
        stop(process)


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
        source = browser.page_source
        assert "bob-" not in source and "robot-bob" not in source
        for grant in (mine, theirs, bob_next, alice_next):
            assert grant["secret"] not in source
        assert browser.execute_script("return sessionStorage.getItem('lease-proxy.token')") == tenants["alice"]
        assert browser.execute_script("return localStorage.length") == 0
        take_screenshot(browser, url, tenants["alice"])
        release(url, "bob-dock", bob_next, tenants["bob"])
        release(url, "alice-dock", alice_next, tenants["alice"])
        browser.find_element(By.ID, "sign-out").click()
        WebDriverWait(browser, 10).until(lambda d: d.find_element(By.ID, "auth").is_displayed())
    finally:
        release(url, "alice-shelf", mine, tenants["alice"])
        release(url, "bob-shelf", theirs, tenants["bob"])
    assert console_errors(browser) == []


def take_screenshot(browser, url: str, token: str) -> None:
    """A busy page for the README: a few robots' aisles, one stalled and taken over."""
    grants = [(f"alice-aisle-{i}", acquire(url, f"alice-aisle-{i}", f"robot-{i}", 10 + 5 * i, token))
              for i in range(1, 5)]  # fmt: skip
    stalled = acquire(url, "alice-aisle-9", "robot-stalled", 2, token)
    shown(browser, lambda d: events(d, "alice-aisle-9")[-1:] == ["expired"], 10, "no expiry")
    rescue = acquire(url, "alice-aisle-9", "robot-rescue", 20, token)
    shown(browser, lambda d: events(d, "alice-aisle-9")[-1:] == ["taken over"], 5, "no take-over")
    release(url, "alice-aisle-2", grants[1][1], token)
    time.sleep(1.5)
    target = Path(os.environ.get("UI_SCREENSHOT") or Path(os.environ.get("TMPDIR", "/tmp")) / "lease-proxy-ui.png")
    browser.save_screenshot(str(target))
    print(f"screenshot: {target}")
    for name, grant in grants:
        if name != "alice-aisle-2":
            release(url, name, grant, token)
    release(url, "alice-aisle-9", rescue, token)
    del stalled
