"""Serving the leader's vLLM app on the node's --host/--port until SIGTERM or SIGINT.

uvicorn with the settings `vllm serve` gives it (log level, access log, keep-alive, TLS, h11
limits, from the same arguments), through vLLM's `NoSignalServer`, which leaves the signals to
this node. The order is the builtin leader's: the port is bound before the engine starts (a
taken port fails at once, not after a minute of loading), the node's /health listener starts
once the API listens and stops first, so the gateway ejects the unit before the API closes;
in-flight requests then get `GRACE_S` to finish before they are cancelled (which aborts their
vLLM requests).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import socket
from typing import Any

from engine.runtime.leader_health import LeaderHealth

# A gateway opens thousands of streams at once; the kernel caps this at net.core.somaxconn.
LISTEN_BACKLOG = 4096
GRACE_S = 5
STARTED_POLL_S = 0.05


def bind(host: str, port: int) -> socket.socket:
    """The API's socket, bound (not yet listening: connections are refused until it serves)."""
    from vllm.entrypoints.launchers.launcher import create_server_socket

    sock: socket.socket = create_server_socket((host, port), reuse_port=False)
    return sock


async def serve_until_signal(
    app: Any, args: argparse.Namespace, sock: socket.socket, listener: LeaderHealth
) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    server = _server(app, args)
    app.state.server = server  # vLLM's error handlers stop it once the engine is dead
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    stopper = asyncio.create_task(stop.wait())
    try:
        await _started(server, serving)
        listener.start(sock.getsockname()[1])
        await asyncio.wait({serving, stopper}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopper.cancel()
        await asyncio.to_thread(listener.stop)
        server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await serving


async def _started(server: Any, serving: asyncio.Task[None]) -> None:
    """uvicorn has no start-up callback; it sets `started` once it listens."""
    while not server.started:
        if serving.done():
            serving.result()  # raises what kept it from listening
            raise RuntimeError("the API server stopped before it listened")
        await asyncio.sleep(STARTED_POLL_S)


def _server(app: Any, args: argparse.Namespace) -> Any:
    import uvicorn  # type: ignore[import-not-found, unused-ignore]  # vLLM's dependency
    from vllm import envs
    from vllm.entrypoints.launchers.launcher import NoSignalServer
    from vllm.entrypoints.launchers.utils.server_utils import get_uvicorn_log_config

    options: dict[str, Any] = {}
    if (log_config := get_uvicorn_log_config(args)) is not None:
        options["log_config"] = log_config
    config = uvicorn.Config(
        app,
        log_level=args.uvicorn_log_level,
        access_log=not args.disable_uvicorn_access_log,
        timeout_keep_alive=envs.VLLM_HTTP_TIMEOUT_KEEP_ALIVE,
        ssl_keyfile=args.ssl_keyfile,
        ssl_certfile=args.ssl_certfile,
        ssl_ca_certs=args.ssl_ca_certs,
        ssl_cert_reqs=args.ssl_cert_reqs,
        ssl_ciphers=args.ssl_ciphers,
        backlog=LISTEN_BACKLOG,
        timeout_graceful_shutdown=GRACE_S,
        **options,
    )
    # Limits vLLM's uvicorn has and older ones lack (uvicorn 0.55 from the bench extra): set by
    # name, so type-checking does not depend on which uvicorn the main venv holds.
    for name in ("h11_max_incomplete_event_size", "h11_max_header_count"):
        setattr(config, name, getattr(args, name))
    config.load()
    return NoSignalServer(config)
