"""Test double for the leader server: a deterministic in-memory `Engine`, and a served app.

The real engine runtime lives elsewhere; the server only needs the `engine.api.Engine`
protocol, so these tests pin the HTTP/OpenAI behaviour against a scripted engine.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from engine.api import Engine, GenerationRequest, TokenEvent
from engine.grammar import GrammarBackend
from engine.model.tokenizer import ByteTokenizer
from engine.server.app import bound_port, build_app

MODEL = "fake-model"
TOKENIZER = ByteTokenizer()
GRAMMARS = GrammarBackend(TOKENIZER, TOKENIZER.vocab_size)
EOS = 257  # ByteTokenizer's <eos>
# (token id, visible text): token 7 shows no text yet (held back by the engine)
SCRIPT = ((72, "Hel"), (101, "lo"), (7, ""), (33, " world"), (46, "!"))
TEXT = "Hello world!"


class FakeEngine:
    """Emits SCRIPT then EOS ("stop"), or stops at max_tokens ("length"); records everything.

    hang_after=k: after k tokens, waits until aborted. fail_after=k: after k tokens, a final
    error event (as when a follower dies). refuse: raised from generate (a typed refusal).
    """

    def __init__(
        self,
        *,
        hang_after: int | None = None,
        fail_after: int | None = None,
        refuse: Exception | None = None,
        health: dict[str, Any] | None = None,
        max_seq_len: int = 64,
    ) -> None:
        self.hang_after, self.fail_after, self.refuse = hang_after, fail_after, refuse
        self.health_fields = health or {"status": "ok", "role": "leader", "unit": "u0", "rank": 0}
        self.requests: list[GenerationRequest] = []
        self.aborts: list[str] = []
        self._aborted: dict[str, asyncio.Event] = {}
        self._max_seq_len = max_seq_len

    @property
    def model_name(self) -> str:
        return MODEL

    @property
    def tokenizer(self) -> ByteTokenizer:
        return TOKENIZER

    @property
    def max_seq_len(self) -> int:
        return self._max_seq_len

    def check_grammar(self, grammar: str) -> None:
        """The real check, against the byte tokenizer: a grammar refused here is refused by a
        real engine with this tokenizer."""
        GRAMMARS.check(grammar)

    def abort(self, request_id: str) -> None:
        self.aborts.append(request_id)
        self._aborted.setdefault(request_id, asyncio.Event()).set()

    def health(self) -> dict[str, Any]:
        if isinstance(self.health_fields.get("raise"), Exception):
            raise self.health_fields["raise"]
        return dict(self.health_fields)

    async def generate(self, request: GenerationRequest) -> AsyncIterator[TokenEvent]:
        self.requests.append(request)
        if self.refuse is not None:
            raise self.refuse
        rid, n = request.request_id, len(request.prompt_ids)
        limit = request.params.max_tokens
        for i, (token, text) in enumerate(SCRIPT):
            if i == self.fail_after:
                yield TokenEvent(rid, None, "", True, "error", n, i, error="follower 1 died")
                return
            if i == self.hang_after:
                await self._aborted.setdefault(rid, asyncio.Event()).wait()
                yield TokenEvent(rid, None, "", True, "abort", n, i)
                return
            await asyncio.sleep(0)
            last = i + 1 == limit
            yield TokenEvent(rid, token, text, last, "length" if last else None, n, i + 1)
            if last:
                return
        yield TokenEvent(rid, EOS, "", True, "stop", n, len(SCRIPT) + 1)


@contextlib.asynccontextmanager
async def served(engine: Engine) -> AsyncIterator[str]:
    """The app on a real socket (port from the OS), as the leader runs it."""
    runner = web.AppRunner(build_app(engine), handler_cancellation=True)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{bound_port(runner)}"
    finally:
        await runner.cleanup()


async def post(
    url: str, body: Any, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, Any]]:
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    async with (
        aiohttp.ClientSession() as session,
        session.post(url, data=data, headers=headers) as r,
    ):
        return r.status, orjson.loads(await r.read())


async def sse_events(url: str, body: dict[str, Any]) -> tuple[aiohttp.ClientResponse, list[str]]:
    """The raw `data:` payloads of a stream, checking the SSE framing on the way."""
    async with aiohttp.ClientSession() as session, session.post(url, json=body) as response:
        raw = await response.read()
    assert raw.endswith(b"\n\n")
    events = raw.decode().split("\n\n")[:-1]
    assert all(e.startswith("data: ") and "\n" not in e for e in events), raw
    return response, [e.removeprefix("data: ") for e in events]


def chunks(events: list[str]) -> list[dict[str, Any]]:
    return [orjson.loads(e) for e in events if e != "[DONE]"]


def chat_body(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **extra}


def completion_body(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": "hi", **extra}


CHAT_PROMPT = TOKENIZER.apply_chat_template([{"role": "user", "content": "hi"}])
COMPLETION_PROMPT = TOKENIZER.encode("hi", add_bos=True)
