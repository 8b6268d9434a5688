"""Token-exact mid-stream resumption with real builtin-engine units.

Two single-node units of the same model sit behind the gateway: the seeded tiny model, and
the real SmolLM2-135M-Instruct (a real answer that ends where the model ends it, no
`ignore_eos`). A greedy stream is started, its leader is SIGKILLed mid-answer, and the
client's stream must be the same answer an uninterrupted run gives: same text word for word,
one id, one role delta, one finish, usage counted once.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway.base.ports import free_port
from gateway.server import Gateway, running
from tests.engine.test_up_support import MODEL, Proc, unitgate
from tests.support import gateway_config, sse_events, usage_counts

pytestmark = [pytest.mark.slow, pytest.mark.both_relays]

MAX_TOKENS = 320  # long enough that the kill lands mid-answer even on a fast machine
KILL_AFTER = 8  # content chunks the client has before its unit dies


SMOLLM = "SmolLM2-135M-Instruct"


def start_units(tmp_path: Path, served: str, *flags: str) -> Iterator[dict[str, tuple[Proc, str]]]:
    procs: dict[str, tuple[Proc, str]] = {}
    try:
        for unit in ("u0", "u1"):
            port = free_port()
            proc = unitgate(
                tmp_path, unit, "node", "--role", "leader", "--world-size", "1",
                "--master", f"127.0.0.1:{free_port()}", "--port", str(port), "--threads", "1",
                "--unit", unit, "--served-model-name", served, *flags,
            )  # fmt: skip
            procs[unit] = (proc, f"http://127.0.0.1:{port}")
        for proc, _ in procs.values():
            proc.wait_line("health_port=", 60)
        yield procs
    finally:
        for proc, _ in procs.values():
            proc.stop()


@pytest.fixture
def units(tmp_path: Path) -> Iterator[dict[str, tuple[Proc, str]]]:
    yield from start_units(tmp_path, MODEL)


@pytest.fixture
def smollm_units(tmp_path: Path) -> Iterator[dict[str, tuple[Proc, str]]]:
    flags = ("--model", "smollm2", "--max-seq-len", "512", "--num-slots", "2")
    yield from start_units(tmp_path, SMOLLM, *flags)


def config(units: dict[str, tuple[Proc, str]], model: str = MODEL) -> Any:
    specs = [{"id": u, "leader": url, "nodes": [url]} for u, (_, url) in units.items()]
    return gateway_config(specs, gateway={"models": [model]}, retry={"budget_min_per_second": 10.0})


def text_of(chunks: list[Any], chat: bool) -> str:
    parts = []
    for chunk in chunks:
        for choice in chunk.get("choices", []) if isinstance(chunk, dict) else []:
            parts.append((choice["delta"].get("content") or "") if chat else choice["text"])
    return "".join(parts)


async def killed_mid_stream(
    gw: Gateway, units: dict[str, tuple[Proc, str]], path: str, body: dict[str, Any]
) -> tuple[str, list[Any]]:
    """Stream `body`; after KILL_AFTER chunks SIGKILL the unit serving it; read to the end."""
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as http,
        http.post(gw.public_url + path, json=body) as resp,
    ):
        assert resp.status == 200
        victim = resp.headers["x-unitgate-unit"]

        def kill_at(chunks: list[Any]) -> None:
            if len(chunks) == KILL_AFTER:
                units[victim][0].stop(signal.SIGKILL)

        return victim, await sse_events(resp, kill_at)


async def reference(gw: Gateway, path: str, body: dict[str, Any]) -> list[Any]:
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as http,
        http.post(gw.public_url + path, json=body) as resp,
    ):
        assert resp.status == 200
        return await sse_events(resp)


async def test_a_chat_stream_survives_its_leader_being_killed(
    units: dict[str, tuple[Proc, str]],
) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Which running shoes suit flat feet?"}],
        "stream": True,
        "max_tokens": MAX_TOKENS,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }
    async with running(config(units)) as gw:
        expected = await reference(gw, "/v1/chat/completions", body)
        victim, got = await killed_mid_stream(gw, units, "/v1/chat/completions", body)
        metrics = gw.metrics.render().decode()
    assert text_of(got, chat=True) == text_of(expected, chat=True)
    assert got[-1] == "[DONE]" and not any("error" in c for c in got if isinstance(c, dict))
    chunks = [c for c in got if isinstance(c, dict)]
    assert len({c["id"] for c in chunks}) == 1
    assert sum("role" in ch["delta"] for c in chunks for ch in c["choices"]) == 1
    finishes = [ch["finish_reason"] for c in chunks for ch in c["choices"] if ch["finish_reason"]]
    assert finishes == ["length"]
    usage = chunks[-1]["usage"]
    assert usage == usage_counts(expected[-2]["usage"])  # the whole answer, counted once
    assert usage["completion_tokens"] == MAX_TOKENS
    assert all("token_ids" not in ch for c in chunks for ch in c["choices"])
    assert all("prompt_token_ids" not in c for c in chunks)
    assert f'unitgate_resumptions_total{{outcome="ok",unit="{victim}"}} 1.0' in metrics


async def test_a_completion_stream_survives_its_leader_being_killed(
    units: dict[str, tuple[Proc, str]],
) -> None:
    body = {
        "model": MODEL,
        "prompt": "The best tent for two people is",
        "stream": True,
        "max_tokens": MAX_TOKENS,
        "temperature": 0.0,
        "ignore_eos": True,
        "return_token_ids": True,  # the client's own ask: it gets them, continuation included
    }
    async with running(config(units)) as gw:
        expected = await reference(gw, "/v1/completions", body)
        _, got = await killed_mid_stream(gw, units, "/v1/completions", body)
    assert text_of(got, chat=False) == text_of(expected, chat=False)
    chunks = [c for c in got if isinstance(c, dict)]
    assert len({c["id"] for c in chunks}) == 1
    ids = [t for c in chunks for ch in c["choices"] for t in ch.get("token_ids", [])]
    expected_ids = [
        t for c in expected if isinstance(c, dict) for ch in c["choices"] for t in ch["token_ids"]
    ]
    assert ids == expected_ids  # no id shown twice, none missing
    assert got[-1] == "[DONE]"


async def test_a_real_models_answer_survives_its_leader_being_killed_word_for_word(
    smollm_units: dict[str, tuple[Proc, str]],
) -> None:
    """Real text, ended by the model itself: the continuation must pick up the very token
    sequence (the chat template's prompt ids plus the answer so far) and end where it ends."""
    body = {
        "model": SMOLLM,
        "messages": [{"role": "user", "content": "Which running shoes suit flat feet?"}],
        "stream": True,
        "max_tokens": 90,
        "temperature": 0.0,
        "stream_options": {"include_usage": True},
    }
    async with running(config(smollm_units, SMOLLM)) as gw:
        expected = await reference(gw, "/v1/chat/completions", body)
        victim, got = await killed_mid_stream(gw, smollm_units, "/v1/chat/completions", body)
        metrics = gw.metrics.render().decode()
    want = text_of(expected, chat=True)
    assert " shoe" in want.lower() and want.isascii()  # a real answer, not random weights
    assert text_of(got, chat=True) == want
    chunks = [c for c in got if isinstance(c, dict)]
    finishes = [ch["finish_reason"] for c in chunks for ch in c["choices"] if ch["finish_reason"]]
    assert finishes == [
        ch["finish_reason"]
        for c in expected
        if isinstance(c, dict)
        for ch in c["choices"]
        if ch["finish_reason"]
    ]
    assert chunks[-1]["usage"] == usage_counts(expected[-2]["usage"])
    assert f'unitgate_resumptions_total{{outcome="ok",unit="{victim}"}} 1.0' in metrics
