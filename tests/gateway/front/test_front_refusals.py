"""A body over `max_body_bytes`, sent by real clients to a gateway on either front: each gets
the 413 and its JSON error, not a reset. urllib and the `openai` SDK (httpx) send the whole
body before they read; curl, with `Expect: 100-continue`, waits to be asked for it."""

from __future__ import annotations

import asyncio
import json
import ssl
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import openai
import pytest

from gateway.paths import CHAT_PATH
from tests.gateway.front.front_support import Arrivals, gateway, recording_unit
from tests.support import MODEL
from tests.tls_support import make_certs

BIG = 64 * 1024 * 1024  # the body, 16 times `max_body_bytes`' default
FRONTS = ["lean", "aiohttp"]


def _big_body() -> bytes:
    head = b'{"model":"%s","messages":[{"role":"user","content":"' % MODEL.encode()
    return head + b"x" * (BIG - len(head) - 4) + b'"}]}'


def _urllib_post(
    url: str, body: bytes, context: ssl.SSLContext | None = None
) -> tuple[int, dict[str, Any]]:
    """POST with urllib (the whole body, then the answer): its status and JSON."""
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30, context=context) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.mark.parametrize("front", FRONTS)
async def test_urllib_gets_the_413_of_a_body_too_large(
    monkeypatch: pytest.MonkeyPatch, front: str
) -> None:
    async with recording_unit() as (unit, url), gateway(monkeypatch, front, url) as gw:
        started = time.monotonic()
        status, answer = await asyncio.to_thread(
            _urllib_post, gw.public_url + CHAT_PATH, _big_body()
        )
        took = time.monotonic() - started
    assert (status, answer["error"]["code"]) == (413, "body_too_large")
    assert not unit.bodies
    assert took < 10.0  # well within the lingering close's own bound


def _sdk_create(base_url: str, client: str) -> openai.APIStatusError:
    """One chat request of BIG bytes with the `openai` SDK, in this thread (its async client
    on a loop of its own): the error it raises."""
    messages: Any = [{"role": "user", "content": "x" * BIG}]
    options: Any = {"base_url": base_url, "api_key": "k", "max_retries": 2, "timeout": 30.0}
    with pytest.raises(openai.APIStatusError) as raised:
        if client == "sync":
            with openai.OpenAI(**options) as sync:
                sync.chat.completions.create(model=MODEL, messages=messages)
        else:

            async def create() -> None:
                async with openai.AsyncOpenAI(**options) as aio:
                    await aio.chat.completions.create(model=MODEL, messages=messages)

            asyncio.run(create())
    return raised.value


@pytest.mark.parametrize("client", ["sync", "async"])
@pytest.mark.parametrize("front", FRONTS)
async def test_the_openai_sdk_gets_the_413_and_sends_the_body_once(
    monkeypatch: pytest.MonkeyPatch, front: str, client: str
) -> None:
    """The SDK retries a reset (twice, by default); a 413 it does not."""
    arrivals = Arrivals()
    async with recording_unit() as (_, url), gateway(monkeypatch, front, url) as gw:
        gw.signals.subscribe(arrivals)
        error = await asyncio.to_thread(_sdk_create, gw.public_url + "/v1", client)
    assert error.status_code == 413 and error.code == "body_too_large"
    assert arrivals.count == 1


async def test_the_413_reaches_a_client_over_tls(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """On TLS the write side cannot be shut alone; the lingering close still reads the rest."""
    certs = make_certs(tmp_path)
    tls = {"tls_cert": str(certs.server_cert), "tls_key": str(certs.server_key)}
    async with recording_unit() as (_, url), gateway(monkeypatch, "lean", url, gateway=tls) as gw:
        assert gw.public_url.startswith("https://")
        post = (gw.public_url + CHAT_PATH, _big_body(), certs.client_context())
        status, answer = await asyncio.to_thread(_urllib_post, *post)
    assert (status, answer["error"]["code"]) == (413, "body_too_large")


async def test_curl_expecting_100_continue_gets_the_413_without_sending_the_body(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The lean front refuses on the length before it would send `100 Continue`: the body
    never leaves the client. (aiohttp's front sends `100 Continue` first, then refuses.)"""
    big = tmp_path / "big.json"
    big.write_bytes(_big_body())
    out = tmp_path / "answer.json"
    async with recording_unit() as (_, url), gateway(monkeypatch, "lean", url) as gw:
        curl = await asyncio.create_subprocess_exec(
            *("curl", "-sS", "-o", str(out), "-w", "%{http_code} %{size_upload}"),
            *("-H", "Content-Type: application/json", "-H", "Expect: 100-continue"),
            *("--expect100-timeout", "30", "--data-binary", f"@{big}"),
            gw.public_url + CHAT_PATH,
            stdout=asyncio.subprocess.PIPE,
        )
        printed, _ = await asyncio.wait_for(curl.communicate(), 30.0)
    assert curl.returncode == 0
    status, uploaded = printed.decode().split()
    assert (status, uploaded) == ("413", "0")
    assert json.loads(out.read_bytes())["error"]["code"] == "body_too_large"
