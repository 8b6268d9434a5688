"""The status page's classes and tenants tables in a real headless Chromium, fed a fixed
snapshot by the real page handlers (no gateway, no units: what the script draws is checked)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, cast

import pytest
from aiohttp import web
from selenium.webdriver.remote.webdriver import WebDriver

from gateway.admin.auth import Authenticator
from gateway.status.feed import StatusFeed
from gateway.status.page import StatusPage
from tests.integration.browser_support import chromium, snapshot, until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

NONE = "\u2013"  # what the page shows for no value (an en dash)
CLASS = {"waiting": 3, "in_flight": 2, "wait_p50": 0.012, "wait_p99": 1.5, "refused_per_s": 2.5}
SNAPSHOT: dict[str, Any] = {
    "time": 0,
    "units": [],
    "panic": {},
    "events": [],
    "classes": [
        {"name": "batch", **CLASS, "fairness": 0.625},
        {"name": "interactive", **CLASS, "wait_p50": None, "wait_p99": None, "fairness": None},
    ],
    "tenants": [
        {
            "tenant": "acme",
            "rps": 5.0,
            "tokens_per_s": 250.0,
            "refused_per_s": 1.0,
            "classes": {"batch": 3.75, "interactive": 1.25},
        },
        {
            "tenant": "other",
            "rps": 1.0,
            "tokens_per_s": 10.0,
            "refused_per_s": 0.0,
            "classes": {"batch": 1.0},
        },
    ],
}


class Open:
    def who(self, header: str | None) -> str:
        return "anyone"


@contextmanager
def page() -> Iterator[str]:
    """The real status routes on an ephemeral port, in a thread of their own."""
    loop = asyncio.new_event_loop()
    started: list[web.AppRunner] = []

    async def start() -> str:
        async def build() -> dict[str, Any]:
            return SNAPSHOT

        app = web.Application()
        app.add_routes(StatusPage(StatusFeed(build), lambda: cast(Authenticator, Open())).routes())
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        started.append(runner)
        port = runner.addresses[0][1]
        return f"http://127.0.0.1:{port}"

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    url = asyncio.run_coroutine_threadsafe(start(), loop).result(10)
    try:
        yield url
    finally:
        asyncio.run_coroutine_threadsafe(started[0].cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


def texts(browser: WebDriver, selector: str) -> list[list[str]]:
    return [row.cells for row in snapshot(browser, selector)]


def test_the_page_draws_each_class_and_the_top_tenants() -> None:
    with page() as url, chromium() as browser:
        browser.get(url + "/status")
        until(lambda: len(texts(browser, "#classes tbody tr")) == 2, 10, "the classes")
        assert texts(browser, "#classes tbody tr") == [
            ["batch", "3", "2", "12 ms", "1.50 s", "2.5", "0.63"],
            ["interactive", "3", "2", NONE, NONE, "2.5", NONE],
        ]
        assert texts(browser, "#tenants tbody tr") == [
            ["acme", "5.0", "250", "1.0", "batch 75% · interactive 25%"],
            ["other", "1.0", "10", "0.0", "batch 100%"],
        ]
        assert snapshot(browser, "#tenants tbody tr")[0].attrs["data-tenant"] == "acme"
