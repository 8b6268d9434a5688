"""One worker process: the public listener and the request path, routing from the control
plane's state.

Started by the control plane with one end of a socket pair. It reads its settings from the
first message (the control plane's own validated config, so the two cannot disagree), waits
for the first state before it listens (a worker never routes on state it has not been sent),
then applies each state message as it comes. It leaves when told (SIGTERM: drain, as one
process would) and also when the control plane is gone (EOF): it stops accepting at once,
lets its streams finish for up to `shutdown_timeout`, and exits, so a restarted gateway never
shares its port with orphans routing on stale state.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import signal
import socket

from gateway.config import Config
from gateway.config.builder import build
from gateway.heap import freeze_startup
from gateway.server import Gateway, Role
from gateway.workers import frames, state
from gateway.workers.link import Link

log = logging.getLogger("unitgate")

FIRST_STATE_WITHIN = 30.0  # seconds for the control plane's first messages


async def run(link_fd: int) -> int:
    sock = socket.socket(fileno=link_fd)
    reader, writer = await asyncio.open_unix_connection(sock=sock)
    hello = await asyncio.wait_for(frames.read(reader), FIRST_STATE_WITHIN)
    if hello is None or hello["t"] != "hello":
        raise frames.FrameError(f"expected the control plane's hello, got {hello!r}")
    index, count = int(hello["index"]), int(hello["count"])
    config: Config = build(Config, hello["config"], "")
    gateway_config = dataclasses.replace(config.gateway, port=int(hello["port"]))
    config = dataclasses.replace(config, gateway=gateway_config)
    a = config.admission
    limit = state.share(a.max_inflight, count, index) if a.max_inflight else None
    link = Link(writer)
    role = Role(control=False, reuse_port=True, record=link.outcome, limit=limit)
    gateway = Gateway(config, role=role)
    link.attach(
        gateway.units,
        gateway.live.flowing_for,
        gateway.metrics.registry,
        gateway.admission.by_class,
        gateway.tenants.shares,
        gateway.live.progressed,
        gateway.knowledge.latency_figures,
        gateway.rollout_samples,
    )
    gateway.events.on_event(link.event)
    gateway.signals.subscribe(link)
    first = await asyncio.wait_for(frames.read(reader), FIRST_STATE_WITHIN)
    if first is None or first["t"] != "state":
        raise frames.FrameError(f"expected the first state, got {first!r}")
    state.apply(gateway.units, first, count, index)
    state.apply_keys(gateway.keys, first)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await gateway.start()
    link.start()
    freeze_startup()
    link.send({"t": "ready", "pid": os.getpid(), "applied": first["v"]})
    reading = loop.create_task(_follow(reader, gateway, link, count, index))
    stopping = loop.create_task(stop.wait())
    await asyncio.wait({reading, stopping}, return_when=asyncio.FIRST_COMPLETED)
    why = "told to stop" if stop.is_set() else "the control plane is gone"
    log.info("worker %d: %s, draining for up to %g s", index, why, config.gateway.shutdown_timeout)
    for task in (reading, stopping):
        task.cancel()
    await asyncio.gather(reading, stopping, return_exceptions=True)
    gateway.draining = True
    await gateway.stop()
    await link.stop()  # after the drain: the last report and metrics count every answer
    writer.close()
    return 0


async def _follow(
    reader: asyncio.StreamReader, gateway: Gateway, link: Link, count: int, index: int
) -> None:
    """Apply each state message in order; return at EOF (the control plane died)."""
    while (message := await frames.read(reader)) is not None:
        if message["t"] == "state":
            state.apply_keys(gateway.keys, message)  # first: a revocation is the urgent part
            state.apply(gateway.units, message, count, index)
            link.send({"t": "applied", "v": message["v"]})
        elif message["t"] == "load":
            state.apply_load(gateway.units, message)
        elif message["t"] == "scrape":  # a /metrics scrape is waiting for fresh samples
            link.send_metrics(message["n"])
