"""Running the builtin engine's leader server until the node is told to stop, and the node
contract's thread listener (`health_at`) every backend's leader uses.

The vLLM backend's leader serves vLLM's own OpenAI server instead (engine/backends/vllm/
server.py) and takes only `health_at` from here; nothing here imports a backend, so each
backend can import it.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal

from engine.api import Engine
from engine.runtime.leader_health import HealthAt, LeaderHealth
from engine.server.app import serve
from engine.settings import NodeSettings


def health_at(settings: NodeSettings) -> HealthAt | None:
    """Unset --health-port: /health is answered on the API port only."""
    if settings.health_port is None:
        return None
    return HealthAt(settings.health_host, settings.health_port)


async def serve_until_signal(
    engine: Engine, host: str, port: int, health: HealthAt | None = None
) -> None:
    """The leader server of either backend, until SIGTERM/SIGINT."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    listener = LeaderHealth(engine.health, health)
    server = asyncio.create_task(serve(engine, host, port, ready=listener.start))
    stopper = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait({server, stopper}, return_when=asyncio.FIRST_COMPLETED)
        stopper.cancel()
        if server.done():  # it failed to listen: raise that
            server.result()
    finally:
        await asyncio.to_thread(listener.stop)
        server.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await server
