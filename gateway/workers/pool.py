"""The control plane's side: the worker processes and their links (reports.py merges what
they report).

Each worker runs under a supervising task that starts it, serves its link, and starts it
again when it exits, after a backoff (0.1 s doubling to 10 s, back to 0.1 s once a worker has
stayed up 30 s), logging each exit once. The others keep serving throughout.

Every change to the routing state (a bit, a unit added or removed, a cap, any event) marks the
state dirty; one broadcast per loop iteration sends the whole state, numbered, to every
worker, which acknowledges the number it applied: the time from send to acknowledgement is
the propagation time, kept per worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from gateway.config import Config
from gateway.config.builder import table
from gateway.observability.events import Event
from gateway.observability.fleet import Fleet
from gateway.observability.logformat import current_format
from gateway.server import Gateway
from gateway.workers import frames, state
from gateway.workers.reports import Reports

log = logging.getLogger("unitgate")

READY_WITHIN = 30.0  # seconds for a started worker to listen
SCRAPE_WITHIN = 1.0  # seconds a /metrics scrape waits for the workers' fresh samples
BACKOFF_FIRST, BACKOFF_MAX, STABLE_AFTER = 0.1, 10.0, 30.0


@dataclass
class Worker:
    index: int
    pid: int | None = None
    started: float = 0.0
    restarts: int = 0
    applied: int = -1
    requests_before: int = 0  # served by the worker's earlier lives
    scraped: int = 0  # the newest scrape it has answered
    writer: asyncio.StreamWriter | None = None
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    propagation: deque[float] = field(default_factory=lambda: deque(maxlen=1000))
    # version -> when it was sent (time.monotonic(): uvloop's clock ticks in milliseconds),
    # for versions sent once the worker listened (earlier ones wait in its socket by design)
    sent: dict[int, float] = field(default_factory=dict)


class WorkerPool:
    def __init__(self, config: Config, reports: Reports, fleet: Fleet, count: int) -> None:
        self.config, self.reports, self.fleet = config, reports, fleet
        self._gateway: Gateway | None = None
        self.workers = [Worker(i) for i in range(count)]
        self.version = 0
        self._scrapes = 0
        self._scraped = asyncio.Event()
        self._dirty = False
        self._keys_sent = -1  # the key table's version last broadcast
        self._acked: asyncio.Future[None] | None = None  # done at the next acknowledgement
        self._stopping = False
        self._tasks: list[asyncio.Task[None]] = []
        self._port_holder: socket.socket | None = None
        self.port = 0

    @property
    def url(self) -> str:
        g = self.config.gateway
        return f"{'https' if g.tls_cert else 'http'}://{g.host}:{self.port}"

    @property
    def gateway(self) -> Gateway:
        if self._gateway is None:
            raise RuntimeError("the worker pool has not been started")
        return self._gateway

    async def start(self, gateway: Gateway) -> None:
        """Reserve the public port, start every worker, return once all of them listen."""
        self._gateway = gateway
        self._port_holder = _reserve(self.config.gateway.host, self.config.gateway.port)
        self.port = self._port_holder.getsockname()[1]
        units = self.gateway.units
        units.on_change(lambda _change: self._changed())
        units.on_membership(lambda _unit, _added: self._changed())
        units.on_revisions(lambda _revisions: self._changed())
        units.on_panic(lambda _change: self._changed())
        self.gateway.events.on_event(lambda _event: self._changed())
        self.gateway.keys.on_change(lambda _ring: self._changed())
        self._keys_sent = self.gateway.keys.version  # each worker's first state has them
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._supervise(w)) for w in self.workers]
        waits = [w.ready.wait() for w in self.workers]
        try:
            await asyncio.wait_for(asyncio.gather(*waits), READY_WITHIN)
        except TimeoutError:
            await self.stop()
            raise RuntimeError(f"workers did not all listen within {READY_WITHIN:g} s") from None

    async def stop(self) -> None:
        """SIGTERM every worker (each drains as one process would), then wait for them."""
        self._stopping = True
        for worker in self.workers:
            if worker.pid is not None:
                _signal(worker.pid, signal.SIGTERM)
        grace = self.config.gateway.shutdown_timeout + 5.0
        if self._tasks:
            _, pending = await asyncio.wait(self._tasks, timeout=grace)
            for worker in self.workers:
                if pending and worker.pid is not None:
                    _signal(worker.pid, signal.SIGKILL)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        if self._port_holder is not None:
            self._port_holder.close()
            self._port_holder = None

    def view(self) -> list[dict[str, Any]]:
        now = time.monotonic()
        return [
            {
                "index": w.index,
                "pid": w.pid,
                "up_s": round(now - w.started, 3) if w.pid is not None else None,
                "restarts": w.restarts,
                "applied": w.applied,
                "requests": self.reports.requests.get(w.index, 0) + w.requests_before,
                "propagation_ms": _percentiles(w.propagation),
            }
            for w in self.workers
        ]

    async def refresh(self, within: float = SCRAPE_WITHIN) -> None:
        """Before /metrics renders: fresh samples from every listening worker, so a scrape
        counts every request answered before it (a worker that does not answer within
        `within` is rendered from its last samples, at most a second old)."""
        self._scrapes += 1
        number = self._scrapes
        asking = [w for w in self.workers if w.writer is not None and w.ready.is_set()]
        for worker in asking:
            assert worker.writer is not None
            worker.writer.write(frames.encode({"t": "scrape", "n": number}))
        deadline = asyncio.get_running_loop().time() + within
        while any(w.scraped < number and w.ready.is_set() for w in asking):
            self._scraped.clear()
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._scraped.wait(), left)

    # -- the state, out --

    def _changed(self) -> None:
        if not self._dirty:
            self._dirty = True
            asyncio.get_running_loop().call_soon(self._broadcast)

    def _broadcast(self) -> None:
        self._dirty = False
        self.version += 1
        ring = self.gateway.keys
        keys = ring if ring.version != self._keys_sent else None  # only when they changed
        self._keys_sent = ring.version
        frame = frames.encode(state.encode(self.gateway.units, self.version, keys))
        now = time.monotonic()
        for worker in self.workers:
            if worker.writer is not None and not worker.writer.is_closing():
                worker.writer.write(frame)
                if worker.ready.is_set():
                    worker.sent[self.version] = now
                    if len(worker.sent) > 1000:  # acknowledgements lost with a dead worker
                        del worker.sent[min(worker.sent)]

    async def settled(self, within: float) -> bool:
        """Until every worker serving has applied the state as it is now (a change made
        before this call included), at most `within` seconds; False if one had not."""
        loop = asyncio.get_running_loop()
        target = self.version + (1 if self._dirty else 0)  # a change not yet broadcast
        deadline = loop.time() + within
        while True:
            behind = [w.index for w in self.workers if _serving(w) and w.applied < target]
            left = deadline - loop.time()
            if not behind:
                return True
            if left <= 0:
                log.warning(
                    "workers %s had not applied state %d after %g s", behind, target, within
                )
                return False
            if self._acked is None or self._acked.done():
                self._acked = loop.create_future()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._acked), left)

    # -- one worker's life --

    async def _supervise(self, worker: Worker) -> None:
        backoff = BACKOFF_FIRST
        while True:  # until stop(): a worker that exits is started again
            began = time.monotonic()
            code = await self._run(worker)
            if self._stopping:
                break
            if time.monotonic() - began >= STABLE_AFTER:
                backoff = BACKOFF_FIRST
            log.warning(
                "worker %d (pid %s) exited with %s; starting it again in %.1f s",
                worker.index,
                worker.pid,
                code,
                backoff,
            )
            worker.restarts += 1
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, BACKOFF_MAX)

    async def _run(self, worker: Worker) -> int | None:
        """Start the worker and serve its link until it exits; returns its exit code."""
        ours, theirs = socket.socketpair()
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "gateway",
                "worker",
                "--link-fd",
                str(theirs.fileno()),
                "--log-level",
                logging.getLevelName(logging.getLogger().getEffectiveLevel()).lower(),
                "--log-format",
                current_format(),
                pass_fds=(theirs.fileno(),),
            )
        finally:
            theirs.close()
        worker.pid, worker.started = proc.pid, time.monotonic()
        reader, writer = await asyncio.open_unix_connection(sock=ours)
        worker.writer = writer
        hello = {
            "t": "hello",
            "index": worker.index,
            "count": len(self.workers),
            "port": self.port,
            "config": table(self.config),
        }
        writer.write(frames.encode(hello))
        first = state.encode(self.gateway.units, self.version, self.gateway.keys)
        writer.write(frames.encode(first))
        serving = asyncio.get_running_loop().create_task(self._serve(worker, reader))
        try:
            code = await proc.wait()
        finally:
            serving.cancel()
            await asyncio.gather(serving, return_exceptions=True)
            worker.writer = None
            worker.ready.clear()
            worker.sent.clear()
            writer.close()
            worker.requests_before += self.reports.requests.get(worker.index, 0)
            self.reports.forget(worker.index)
            self.fleet.retire(worker.index)
            self._count_inflight()
        return code

    async def _serve(self, worker: Worker, reader: asyncio.StreamReader) -> None:
        loop = asyncio.get_running_loop()
        try:
            while (message := await frames.read(reader)) is not None:
                self._handle(worker, message, loop.time())
        except frames.FrameError as exc:
            log.error("worker %d: bad message on its link (%s); stopping it", worker.index, exc)
            if worker.pid is not None:
                _signal(worker.pid, signal.SIGKILL)

    def _handle(self, worker: Worker, message: dict[str, Any], now: float) -> None:
        kind = message["t"]
        if kind == "outcome":
            unit = self.gateway.units.units.get(message["unit"])
            if unit is not None:
                self.gateway.breakers.record(unit, bool(message["ok"]), now - message["age"])
        elif kind == "report":
            self.reports.update(worker.index, now, message)
            self._count_inflight()
            self._send_load(worker)
        elif kind == "rollout":
            self.reports.rollout.update(worker.index, message["windows"])
        elif kind == "metrics":
            self.fleet.update(worker.index, message["samples"])
            self.fleet.update_shares(worker.index, message.get("fairness", {}))
            self.fleet.update_latency(worker.index, message.get("latency", {}))
            if message.get("scrape") is not None:
                worker.scraped = max(worker.scraped, int(message["scrape"]))
                self._scraped.set()
        elif kind == "event":
            fields = {k: message[k] for k in ("time", "unit", "what", "reason", "who")}
            self.gateway.events.append(Event(**fields))
        elif kind == "applied":
            version = int(message["v"])
            worker.applied = max(worker.applied, version)
            self._ack()
            sent = worker.sent.pop(version, None)
            if sent is not None:
                worker.propagation.append(time.monotonic() - sent)
        elif kind == "ready":
            worker.applied = max(worker.applied, int(message["applied"]))
            worker.ready.set()
            self._ack()

    def _ack(self) -> None:
        acked, self._acked = self._acked, None
        if acked is not None and not acked.done():
            acked.set_result(None)

    def _send_load(self, worker: Worker) -> None:
        """The answer to a report: per unit, the requests that are not this worker's (the
        other workers' and, from the leader's report, other replicas'), so workers balance
        on the unit's whole load as one process does (gateway/routing/load.py)."""
        if worker.writer is None:
            return
        own = self.reports.own(worker.index)
        others = {
            u.id: n
            for u in self.gateway.units.units.values()
            if (n := u.foreign + u.inflight - own.get(u.id, 0)) > 0
        }
        worker.writer.write(frames.encode({"t": "load", "others": others}))

    def _count_inflight(self) -> None:
        for unit in self.gateway.units.units.values():
            unit.inflight = self.reports.inflight(unit.id)


def _reserve(host: str, port: int) -> socket.socket:
    """Bind (not listen) the public port with SO_REUSEPORT: it picks the port when 0 and
    holds it while workers restart; only listening sockets are given connections."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    return sock


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def _percentiles(samples: deque[float]) -> dict[str, float] | None:
    if not samples:
        return None
    ordered = sorted(samples)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e3, 3)

    return {"p50": at(0.5), "p99": at(0.99), "max": round(ordered[-1] * 1e3, 3)}


def _serving(worker: Worker) -> bool:
    """Listening, and linked to the control plane (a worker between lives is not waited for:
    its next life starts from the state as it is then)."""
    writer = worker.writer
    return worker.ready.is_set() and writer is not None and not writer.is_closing()
