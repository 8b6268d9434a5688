"""Helpers for the status page tests in a real headless Chromium: the browser, polling with a
deadline, and a recording relay that shows what the gateway's listener was sent."""

from __future__ import annotations

import asyncio
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from selenium import webdriver
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.remote.webdriver import WebDriver

POLL_S = 0.02


@contextmanager
def chromium(width: int = 1400, height: int = 900) -> Iterator[WebDriver]:
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    assert chromium and driver, "chromium and chromium-driver are missing (make test installs them)"
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        f"--window-size={width},{height}",
    ):
        options.add_argument(flag)
    # An explicit chromedriver: selenium's manager would otherwise try to download one.
    browser = webdriver.Chrome(options=options, service=Service(executable_path=driver))
    try:
        yield browser
    finally:
        browser.quit()


def until(check: Callable[[], object], within: float, what: str) -> float:
    """Poll `check()` (DOM reads) until true; returns the seconds it took."""
    started = time.monotonic()
    while True:
        try:
            if check():
                return time.monotonic() - started
        except (NoSuchElementException, StaleElementReferenceException):
            pass  # the row is being re-rendered: look again
        assert time.monotonic() - started < within, f"not in time: {what}"
        time.sleep(POLL_S)


# One script call reads every matching element at once: the page redraws its tables on each
# poll, so reading row by row through WebDriver can meet a row that was just replaced.
_SNAPSHOT_JS = """
return Array.from(document.querySelectorAll(arguments[0]), el => ({
  text: (el.innerText ?? el.textContent ?? "").trim(),  // SVG elements have no innerText
  attrs: Object.fromEntries(Array.from(el.attributes, a => [a.name, a.value])),
  cells: Array.from(el.querySelectorAll("td"), td => td.innerText.trim()),
}));
"""


@dataclass(frozen=True)
class Shown:
    """What one element showed: its text, its attributes and its cells' texts."""

    text: str
    attrs: dict[str, str]
    cells: list[str]


def snapshot(browser: WebDriver, selector: str) -> list[Shown]:
    """Every element matching `selector`, read in one step of the page's own thread."""
    found = browser.execute_script(_SNAPSHOT_JS, selector)
    return [Shown(str(e["text"]), dict(e["attrs"]), [str(c) for c in e["cells"]]) for e in found]


class Recorder:
    """A TCP relay on 127.0.0.1 in front of a listener, keeping every byte clients sent it:
    exactly what the server behind it received, request lines and headers included."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self._sent = bytearray()
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="recorder", daemon=True)

    def __enter__(self) -> Recorder:
        self._thread.start()
        assert self._ready.wait(5.0), "the recorder did not start"
        return self

    def __exit__(self, *_: object) -> None:
        asyncio.run_coroutine_threadsafe(self._cancel_all(), self._loop).result(5.0)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5.0)

    async def _cancel_all(self) -> None:
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def sent(self) -> bytes:
        with self._lock:
            return bytes(self._sent)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._relay, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            server.close()
            self._loop.close()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        async with asyncio.timeout(120):
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
            await asyncio.gather(
                self._pipe(reader, up_writer, record=True),
                self._pipe(up_reader, writer, record=False),
                return_exceptions=True,
            )

    async def _pipe(
        self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, *, record: bool
    ) -> None:
        try:
            while data := await src.read(65536):
                if record:
                    with self._lock:
                        self._sent += data
                dst.write(data)
                await dst.drain()
        finally:
            dst.close()
