"""The load: the workload's requests, streamed, at a fixed concurrency (a closed loop: each of
`concurrency` workers sends the next request in the sequence when its last answer ended).

Time to first token runs from sending the request to the first chunk carrying text; output
tokens are the usage chunk's (`stream_options.include_usage`), which every router relays.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass

import aiohttp
import orjson

REQUEST_TIMEOUT_S = 600.0  # a request queued behind cold prefills on a busy core
HEADERS = {"content-type": "application/json"}


@dataclass(frozen=True, slots=True)
class Answer:
    ttft_s: float | None  # None: no token came
    tokens: int
    error: str = ""


@dataclass(frozen=True, slots=True)
class Phase:
    answers: tuple[Answer, ...]
    wall_s: float

    @property
    def ttfts_s(self) -> list[float]:
        return sorted(a.ttft_s for a in self.answers if a.ttft_s is not None and not a.error)

    @property
    def failures(self) -> int:
        return sum(1 for a in self.answers if a.error)

    @property
    def tokens_per_s(self) -> float:
        return sum(a.tokens for a in self.answers) / self.wall_s if self.wall_s else 0.0


async def one(http: aiohttp.ClientSession, url: str, body: bytes) -> Answer:
    sent, first, tokens, chunks = time.perf_counter(), None, None, 0
    try:
        async with http.post(f"{url}/v1/chat/completions", data=body, headers=HEADERS) as resp:
            if resp.status != 200:
                return Answer(None, 0, f"HTTP {resp.status}: {(await resp.text())[:200]}")
            async for raw in resp.content:
                if not raw.startswith(b"data: {"):
                    continue
                chunk = orjson.loads(raw[6:])
                if _has_text(chunk):
                    chunks += 1
                    if first is None:
                        first = time.perf_counter() - sent
                usage = chunk.get("usage")
                if usage:
                    tokens = int(usage.get("completion_tokens") or 0)
    except (aiohttp.ClientError, TimeoutError) as exc:
        return Answer(first, 0, f"{type(exc).__name__}: {exc}")
    if first is None:
        return Answer(None, 0, "no token in the answer")
    return Answer(first, chunks if tokens is None else tokens)


def _has_text(chunk: dict[str, object]) -> bool:
    choices = chunk.get("choices")
    if not isinstance(choices, list) or not choices:
        return False
    delta = choices[0].get("delta") if isinstance(choices[0], dict) else None
    return isinstance(delta, dict) and bool(delta.get("content"))


async def phase(url: str, bodies: Sequence[bytes], concurrency: int) -> Phase:
    """All of `bodies` through `url`, `concurrency` at a time, in their order."""
    answers: list[Answer | None] = [None] * len(bodies)
    following = iter(range(len(bodies)))
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as http:

        async def worker() -> None:
            for i in following:
                answers[i] = await one(http, url, bodies[i])

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - start
    return Phase(tuple(a for a in answers if a is not None), wall)
