"""Builtin engine leaders in the test's own process: tiny seeded models behind the engine's
real HTTP server on 127.0.0.1, optionally with their steps slowed (a test that needs a request
to wait in a queue, or a head to come a step before a token, needs steps it can see)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import replace

from aiohttp import web

from engine.model import ByteTokenizer, ModelConfig, init_from_seed
from engine.runtime.leader import LeaderEngine
from engine.server import build_app


@contextlib.asynccontextmanager
async def tiny_leaders(
    count: int, *, slots: int, model: str, step_s: float = 0.0
) -> AsyncIterator[list[tuple[LeaderEngine, str]]]:
    """`count` leaders (units u0, u1, ...; seeds 0, 1, ...), each with `slots` KV slots and
    max_seq_len 512, serving `model`; yields each engine with its base URL."""
    config = replace(ModelConfig.tiny(), max_seq_len=512)
    on_step = (lambda start, end: time.sleep(step_s)) if step_s else None
    made: list[tuple[LeaderEngine, str]] = []
    runners: list[web.AppRunner] = []
    try:
        for index in range(count):
            engine = LeaderEngine(
                init_from_seed(config, seed=index, num_slots=slots),
                ByteTokenizer(),
                model_name=model,
                unit=f"u{index}",
                on_step=on_step,
            ).start()
            made.append((engine, ""))
            runner = web.AppRunner(build_app(engine), handler_cancellation=True)
            runners.append(runner)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            host, port = runner.addresses[0][:2]
            made[-1] = (engine, f"http://{host}:{port}")
        yield made
    finally:
        for runner in runners:
            await runner.cleanup()
        for engine, _ in made:
            await asyncio.to_thread(engine.shutdown)
