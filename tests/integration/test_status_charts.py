"""The status page at first sight, in a real headless Chromium in front of `unitgate up
--simulated --replicas 2` (replica 0's page): the link `up` prints signs the page in, and
the page draws each unit's live traffic from its stream.

The browser reaches the operator listener through a recording relay (browser_support.py), so
the test sees every byte the gateway was sent: the token in the link's fragment never reaches
it (the page asks for /status, and sends the token only as the stream's Authorization header).
Real traffic runs through the gateway while the page watches; the charts must fill with points
and the screenshot must show them (the screenshot is saved in the test artifacts folder,
UNITGATE_TEST_ARTIFACTS, default test-artifacts/).
"""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import threading
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from gateway.base.ports import free_ports
from tests.engine.test_up_support import Proc, pid_gone, unitgate
from tests.integration.browser_support import Recorder, chromium, snapshot, until
from tests.integration.test_up_replicas import children_of
from tests.support import MODEL, ROOT

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

STATUS_LINK = re.compile(r"^  status   (http://127\.0\.0\.1:(\d+))/status#token=(\S+)$", re.M)
TOKEN_KEY = "unitgate-admin-token"  # where the page keeps a token (status.js)
UNITS = ["u0", "u1"]
CHARTED = ("rps", "p50", "p99", "tps", "inflight")  # each chart's series with points to see


@dataclass
class Up:
    proc: Proc
    ops: str  # the operator listener's URL, from the printed link
    ops_port: int
    token: str
    public: str


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    tmp = tmp_path_factory.mktemp("status-charts")
    a, b, c, d = (f"http://127.0.0.1:{p}" for p in free_ports(4))
    (tmp / "up.toml").write_text(
        f'[gateway]\nport = 0\nmodels = ["{MODEL}"]\nshutdown_timeout = 2.0\n'
        '[metrics]\nport = 0\n[admin]\nstate_file = ""\n'
        f'[[units]]\nid = "u0"\nleader = "{a}"\nnodes = ["{a}", "{b}"]\n'
        f'[[units]]\nid = "u1"\nleader = "{c}"\nnodes = ["{c}", "{d}"]\n'
    )
    # No token in the environment: `up` makes one for the run and prints the signed link.
    env = {k: v for k, v in os.environ.items() if k != "UNITGATE_ADMIN_TOKEN"}
    # Two replicas: the page of replica 0 of a fleet, which the printed link opens.
    config, logs = str(tmp / "up.toml"), str(tmp / "logs")
    args = ("up", "--simulated", "--replicas", "2", "--config", config, "--log-dir", logs)
    proc = unitgate(tmp, "up", *args, env=env)
    try:
        public = proc.wait_line("unitgate up ready ", 60).split()[0]
        link = STATUS_LINK.search(proc.text())
        assert link is not None, proc.tail()
        yield Up(proc, link[1], int(link[2]), link[3], public)
    finally:
        children = children_of(proc.proc.pid)
        proc.stop(signal.SIGTERM)
        for pid in children:  # whatever failed, leave nothing behind
            if not pid_gone(pid):
                os.kill(pid, signal.SIGKILL)


class Traffic:
    """Streamed chats through the gateway (asking for usage, so tokens are counted), two at a
    time with a short pause between, until the block ends."""

    def __init__(self, public: str, clients: int = 2) -> None:
        self.public = public
        self.done = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._loop, daemon=True) for _ in range(clients)]

    def __enter__(self) -> Traffic:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(15)

    def _loop(self) -> None:
        headers = {"Content-Type": "application/json"}
        while not self._stop.wait(0.05):
            body = {
                "model": MODEL,  # prompts differ, or prefix affinity keeps them on one unit
                "messages": [{"role": "user", "content": f"hello, unit ({self.done})"}],
                "stream": True,
                "max_tokens": 24,
                "stream_options": {"include_usage": True},
            }
            data = json.dumps(body).encode()
            request = urllib.request.Request(self.public + "/v1/chat/completions", data, headers)
            try:
                with urllib.request.urlopen(request, timeout=10) as resp:
                    resp.read()
                self.done += 1
            except OSError as exc:
                self.errors.append(repr(exc))


def rows(browser: WebDriver) -> list[str]:
    return sorted(r.attrs["data-unit"] for r in snapshot(browser, "#units tbody tr"))


def points(browser: WebDriver, unit: str, series: str) -> int:
    """How many points the unit's line for `series` has (counted in its SVG path); 0 while
    the page has not drawn that line yet (its unit's charts come with the unit's first data)."""
    found = snapshot(browser, f'.unit-charts[data-unit="{unit}"] path[data-series="{series}"]')
    if not found:
        return 0
    (path,) = found
    d = path.attrs.get("d", "")
    assert int(path.attrs["data-points"]) == d.count("M") + d.count("L")
    return d.count("M") + d.count("L")


def artifacts() -> Path:
    folder = Path(os.environ.get("UNITGATE_TEST_ARTIFACTS", ROOT / "test-artifacts"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


# Decodes a PNG in the page (a canvas) and says what it shows: its size, how many colours,
# how many pixels differ from the top left one (the background), how many are in the colour
# of the charts' first line (light or dark scheme).
PIXELS = """
const [b64, done] = arguments;
const img = new Image();
img.onload = () => {
  const c = document.createElement("canvas");
  c.width = img.width; c.height = img.height;
  const ctx = c.getContext("2d");
  ctx.drawImage(img, 0, 0);
  const d = ctx.getImageData(0, 0, c.width, c.height).data;
  const colours = new Set();
  let ink = 0, line = 0;
  const near = (i, r, g, b) =>
    Math.abs(d[i] - r) + Math.abs(d[i + 1] - g) + Math.abs(d[i + 2] - b) < 60;
  for (let i = 0; i < d.length; i += 4) {
    colours.add((d[i] << 16) | (d[i + 1] << 8) | d[i + 2]);
    if (!near(i, d[0], d[1], d[2])) ink += 1;
    if (near(i, 35, 100, 170) || near(i, 106, 169, 240)) line += 1;
  }
  done({ width: c.width, height: c.height, colours: colours.size, ink, line });
};
img.onerror = () => done(null);
img.src = "data:image/png;base64," + b64;
"""


def test_the_printed_link_signs_the_page_in_and_the_token_never_reaches_the_server(
    up: Up,
) -> None:
    with Recorder(up.ops_port) as relay, chromium() as browser:
        page = f"http://127.0.0.1:{relay.port}/status"
        browser.get(f"{page}#token={up.token}")
        until(lambda: rows(browser) == UNITS, 10, "the units, without pasting anything")
        assert not browser.find_element(By.ID, "login").is_displayed()
        assert browser.execute_script("return location.href") == page  # the fragment is gone
        kept = browser.execute_script(f"return sessionStorage.getItem('{TOKEN_KEY}')")
        assert kept == up.token  # kept as a pasted token would be
    sent = relay.sent().decode("latin-1")
    targets = re.findall(r"^[A-Z]+ (\S+) HTTP/1\.1\r$", sent, re.M)
    assert "/status" in targets and "/status/stream" in targets, targets
    assert not [t for t in targets if "token" in t or "#" in t], targets
    bearer = re.compile(rf"^authorization: bearer {re.escape(up.token)}\r$", re.M | re.I)
    assert bearer.search(sent), "the stream is read with the token as a header"
    assert up.token not in bearer.sub("", sent)  # nowhere else: no request line, no Referer


def test_the_charts_fill_with_live_traffic_and_show_in_a_screenshot(up: Up, tmp_path: Path) -> None:
    with Traffic(up.public) as traffic, chromium(1400, 900) as browser:
        browser.get(f"{up.ops}/status#token={up.token}")
        took = until(
            lambda: all(points(browser, u, s) >= 6 for u in UNITS for s in CHARTED),
            45,
            "6 points on every unit's lines",
        )
        print(f"every chart had 6 points after {took:.1f} s; {traffic.done} requests so far")
        assert traffic.done > 0 and not traffic.errors, traffic.errors[:3]
        summary = snapshot(browser, '.unit-charts[data-unit="u0"] .now')[0].text
        assert "req/s" in summary and "TTFT p50" in summary and "tok/s" in summary, summary
        height = browser.execute_script("return document.documentElement.scrollHeight")
        browser.set_window_size(1400, int(height) + 100)
        png = browser.get_screenshot_as_png()
        shot = browser.execute_async_script(PIXELS, base64.b64encode(png).decode())
    (tmp_path / "status-charts.png").write_bytes(png)
    (artifacts() / "status-page-charts.png").write_bytes(png)
    print(f"screenshot: {len(png)} bytes, {shot}")
    assert len(png) > 20_000
    assert shot is not None and shot["width"] >= 1400 and shot["height"] >= 600, shot
    assert shot["colours"] > 50 and shot["ink"] > 0.02 * shot["width"] * shot["height"], shot
    assert shot["line"] > 200, shot  # the charts' lines are in the picture


def test_without_the_fragment_the_page_asks_for_the_token_as_before(up: Up) -> None:
    with chromium() as browser:
        browser.get(f"{up.ops}/status#token=not-the-token")
        until(lambda: browser.find_element(By.ID, "login").is_displayed(), 10, "the token form")
        assert "refused" in browser.find_element(By.ID, "login-error").text
        assert browser.execute_script("return location.hash") == ""
        browser.get(f"{up.ops}/status")
        until(lambda: browser.find_element(By.ID, "login").is_displayed(), 10, "the token form")
        assert rows(browser) == []
        browser.find_element(By.ID, "token").send_keys(up.token)
        browser.find_element(By.CSS_SELECTOR, "#login button").click()
        until(lambda: rows(browser) == UNITS, 10, "the units, once the token is pasted")
