"""The status page in a real headless Chromium, in front of real builtin-engine units.

`unitgate up` runs two units of two nodes each (TP=2, the seeded tiny model) and its gateway.
Chromium (Debian's, driven through chromedriver with selenium) opens /status, gives the
admin token, and the test checks what an operator would: every unit is on the page; a
follower killed with SIGKILL turns its unit's cell unhealthy within a second (pushed by the
gateway, not polled); the drain button drains a unit. A screenshot of the page is saved in
the test artifacts folder (UNITGATE_TEST_ARTIFACTS, default test-artifacts/).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from tests.chaos.clusters import ROOT, RealCluster, start_real
from tests.integration.browser_support import chromium, snapshot, until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealCluster]:
    cluster = start_real(tmp_path_factory.mktemp("status-browser"))
    try:
        yield cluster
    finally:
        cluster.close()


@pytest.fixture
def browser() -> Iterator[WebDriver]:
    with chromium(1400, 700) as browser:
        yield browser


def artifacts() -> Path:
    folder = Path(os.environ.get("UNITGATE_TEST_ARTIFACTS", ROOT / "test-artifacts"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def cell(browser: WebDriver, unit: str, column: str) -> str:
    """The state shown in a unit's column (health, breaker, admin, routable)."""
    span = browser.find_element(By.CSS_SELECTOR, f'tr[data-unit="{unit}"] td.{column} .state')
    return str(span.get_attribute("data-state"))


def test_the_page_shows_the_fleet_live_and_drains_a_unit(
    up: RealCluster, browser: WebDriver
) -> None:
    browser.get(up.ops.url + "/status")
    until(lambda: browser.find_element(By.ID, "login").is_displayed(), 10, "the token form")
    browser.find_element(By.ID, "token").send_keys(up.ops.token or "")
    browser.find_element(By.CSS_SELECTOR, "#login button").click()
    until(lambda: all(cell(browser, u, "health") == "healthy" for u in up.nodes), 10, "units")
    rows = snapshot(browser, "#units tbody tr")
    assert sorted(r.attrs["data-unit"] for r in rows) == sorted(up.nodes)
    nodes = snapshot(browser, 'tr[data-unit="u0"] .node')
    assert [n.attrs["data-healthy"] for n in nodes] == ["true", "true"]
    assert "ms" in nodes[1].text  # the follower's probe latency

    follower = up.node_pid("u0", 1)
    killed = time.monotonic()
    os.kill(follower, signal.SIGKILL)
    took = until(lambda: cell(browser, "u0", "health") == "unhealthy", 1.0, "u0 unhealthy")
    print(f"follower of u0 killed: its cell unhealthy on the page after {took * 1e3:.0f} ms")
    assert time.monotonic() - killed < 1.0
    assert cell(browser, "u1", "health") == "healthy"
    browser.save_screenshot(str(artifacts() / "status-page-unhealthy.png"))

    browser.find_element(By.CSS_SELECTOR, 'tr[data-unit="u1"] button[data-action="drain"]').click()
    until(lambda: cell(browser, "u1", "admin") == "drained", 5.0, "u1 drained")
    assert up.ops.unit("u1")["admin"]["state"] == "drained"  # the admin API agrees
    assert cell(browser, "u1", "routable") == "no"
    browser.save_screenshot(str(artifacts() / "status-page.png"))

    browser.find_element(By.CSS_SELECTOR, 'tr[data-unit="u1"] button[data-action="enable"]').click()
    until(lambda: cell(browser, "u1", "admin") == "enabled", 5.0, "u1 enabled again")
    # unitgate up restarts u0's gang; the page follows it back.
    until(lambda: cell(browser, "u0", "health") == "healthy", 120, "u0 back")
