"""The builtin engine leader's HTTP app: the OpenAI-compatible API over an `Engine` (the vLLM
backend's leader serves vLLM's own server instead)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from aiohttp import web

from engine.api import Engine
from engine.server.handlers import Handlers

# aiohttp's default backlog of 128 overflows when a gateway opens thousands of streams at once:
# the kernel drops SYNs and connects time out while the leader idles (net.core.somaxconn caps it).
LISTEN_BACKLOG = 4096
# Token-id prompts near a long context are several MB of JSON; aiohttp's default is 1 MB.
MAX_BODY_BYTES = 64 * 1024 * 1024


def build_app(engine: Engine) -> web.Application:
    app = web.Application(client_max_size=MAX_BODY_BYTES)
    handlers = Handlers(engine)
    app.router.add_post("/v1/chat/completions", handlers.chat)
    app.router.add_post("/v1/completions", handlers.completions)
    app.router.add_get("/v1/models", handlers.models)
    app.router.add_get("/health", handlers.health)
    app.router.add_get("/metrics", handlers.metrics)
    return app


async def serve(
    engine: Engine,
    host: str,
    port: int,
    ready: Callable[[int], object] | None = None,
) -> None:
    """Serve until cancelled; `ready` gets the bound port (useful with port 0).

    handler_cancellation=True makes a client disconnect cancel its handler, which aborts the
    engine request at once instead of generating into a dead socket until max_tokens.
    """
    runner = web.AppRunner(
        build_app(engine), handler_cancellation=True, access_log=None, shutdown_timeout=5.0
    )
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port, backlog=LISTEN_BACKLOG)
        await site.start()
        if ready is not None:
            ready(bound_port(runner))
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def bound_port(runner: web.AppRunner) -> int:
    address = runner.addresses[0]
    return int(address[1])
