"""Test servers for the load generator: a small OpenAI-shaped server that records what it was
sent and answers in the ways real servers differ (usage or not, token ids or not), and a word
tokenizer whose counts a test can work out by hand."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web
from tokenizers import Tokenizer, models, pre_tokenizers

from loadtest.gen.workload import FILLER, SHOPPING_PROMPTS

PIECES = ("Hello there", " friend")  # 2 chunks, 3 words
USAGE_TOKENS = 5  # what the usage claims, unlike any other count


@dataclass
class Seen:
    path: str
    headers: dict[str, str]
    body: dict[str, Any] | None


@dataclass
class Recorder:
    """`usage`: send usage (when asked, in a stream); `token_ids`: 3 ids on every piece."""

    model_ids: tuple[str, ...] = ("m1",)
    usage: bool = True
    token_ids: bool = False
    seen: list[Seen] = field(default_factory=list)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/chat/completions", self.answer)
        app.router.add_post("/v1/completions", self.answer)
        return app

    async def models(self, request: web.Request) -> web.Response:
        self.seen.append(Seen(request.path, dict(request.headers), None))
        return web.json_response({"object": "list", "data": [{"id": m} for m in self.model_ids]})

    async def answer(self, request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        self.seen.append(Seen(request.path, dict(request.headers), body))
        chat = request.path.endswith("/chat/completions")
        if not body.get("stream"):
            return web.json_response(self._whole(chat))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for piece in PIECES:
            await response.write(_event({"choices": [self._choice(chat, piece, delta=True)]}))
        if self.usage and body.get("stream_options", {}).get("include_usage"):
            await response.write(_event({"choices": [], "usage": _usage()}))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    def _choice(self, chat: bool, text: str, delta: bool) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0}
        if chat:
            choice["delta" if delta else "message"] = {"content": text}
        else:
            choice["text"] = text
        if self.token_ids:
            choice["token_ids"] = [1, 2, 3]
        return choice

    def _whole(self, chat: bool) -> dict[str, Any]:
        doc: dict[str, Any] = {"choices": [self._choice(chat, "".join(PIECES), delta=False)]}
        if self.usage:
            doc["usage"] = _usage()
        return doc

    def requests(self, path: str) -> list[Seen]:
        return [s for s in self.seen if s.path == path]


def _usage() -> dict[str, int]:
    return {"prompt_tokens": 7, "completion_tokens": USAGE_TOKENS, "total_tokens": 12}


def _event(doc: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(doc) + b"\n\n"


@asynccontextmanager
async def serving(recorder: Recorder) -> AsyncIterator[str]:
    """The recorder on 127.0.0.1 at an OS-assigned port; yields its base URL."""
    runner = web.AppRunner(recorder.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        port = runner.addresses[0][1]
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def word_tokenizer() -> Tokenizer:
    """One token per whitespace-separated word: a real tokenizers.Tokenizer whose counts are
    the word counts, so a test knows them without a model's vocabulary."""
    words = {w for p in SHOPPING_PROMPTS for w in p.split()} | set(FILLER)
    words |= {w for p in PIECES for w in p.split()}
    vocab = {"[UNK]": 0, **{w: i for i, w in enumerate(sorted(words), 1)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tok


def word_tokenizer_folder(folder: Path) -> Path:
    """A Hugging Face style folder holding the word tokenizer's tokenizer.json."""
    folder.mkdir(parents=True, exist_ok=True)
    word_tokenizer().save(str(folder / "tokenizer.json"))
    return folder
