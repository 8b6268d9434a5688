"""The sidecar's HTTP side: `GET /health` answers the node contract for the watched process.

The answer is built from /proc when the probe arrives (`Tracker.look`: one small file read
while the process lives), never from a cached poll, so a kill or a SIGSTOP shows in the very
next probe. The shape is a node's (engine/runtime/health.py): `status`, `unit`, `rank`,
`role`, `pid`, 200 when ok, else 503 with the `status` saying why and an `error`. `cpu_ticks`
(utime + stime) is information only: a follower reports no `step` (the gateway's stall check
reads the leader's).
"""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import Any

import orjson
from aiohttp import web

from gateway.base.net import LISTEN_BACKLOG
from gateway.watch.locate import Sighting, Tracker
from gateway.watch.placement import Identity

log = logging.getLogger(__name__)

SHUTDOWN_TIMEOUT = 1.0  # seconds: a probe takes milliseconds; nothing else is in flight


def answer(identity: Identity, watched: str, sighting: Sighting) -> tuple[int, dict[str, Any]]:
    """The HTTP status and the JSON body of one probe."""
    condition, stat = sighting.condition, sighting.stat
    body: dict[str, Any] = {
        "status": condition.status,
        "unit": identity.unit,
        "rank": identity.rank,
        "role": identity.role,
        "pid": sighting.pid,
        "watched": watched,
    }
    if stat is not None:
        body.update(comm=stat.comm, state=stat.state, cpu_ticks=stat.cpu_ticks)
    if condition.error is not None:
        body["error"] = condition.error
    return (200 if condition.ok else 503), body


def failed(identity: Identity, watched: str, exc: Exception) -> tuple[int, dict[str, Any]]:
    """A look that raised (/proc unreadable, say) is a node that is not ok, told as such:
    a dropped connection would read as a dead sidecar, with a less useful reason."""
    body = {"status": "error", "unit": identity.unit, "rank": identity.rank}
    return 503, {**body, "role": identity.role, "watched": watched, "error": repr(exc)}


def health_app(identity: Identity, tracker: Tracker) -> web.Application:
    watched = tracker.locator.describe()

    async def health(request: web.Request) -> web.Response:
        try:
            status, body = answer(identity, watched, tracker.look())
        except Exception as exc:
            log.exception("reading /proc failed")
            status, body = failed(identity, watched, exc)
        return web.Response(status=status, body=orjson.dumps(body), content_type="application/json")

    app = web.Application()
    app.router.add_get("/health", health)
    return app


async def serve(app: web.Application, host: str, port: int) -> int:
    """Listen, announce `health_port=N` (the line node starters wait for), answer until
    SIGTERM or SIGINT, then stop listening and release the port. Returns the exit code."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=SHUTDOWN_TIMEOUT)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port, backlog=LISTEN_BACKLOG)
        try:
            await site.start()
        except OSError as exc:
            log.error("cannot listen on %s:%d: %s", host, port, exc.strerror or exc)
            return 1
        bound = runner.addresses[0][1]
        print(f"health_port={bound}", flush=True)
        log.info("answering /health on http://%s:%d/health", host, bound)
        await stop.wait()
        log.info("stopping")
        return 0
    finally:
        await runner.cleanup()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
