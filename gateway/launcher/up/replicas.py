"""Gateway replicas 1..N-1 of `unitgate up --replicas N`, each a `unitgate replica` process.

Replica 0 runs inside `up` itself, as the one gateway of a plain `up` does; the others are
children, started like every child of `up` (own session, killed if `up` dies), each logging
to `replica-<i>.log` in the log dir. A child says it is ready (it routes to every local
unit) through its ready file, which also gives its URLs.

A replica that exits before it was ever ready failed on its config or its ports: that ends
the run, since a restart would fail the same way. One that exits later is restarted with the
units' backoff, as a balancer's pool would see a replica come back; it converges from the
shared store as it starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from gateway.base.readyfile import NotReady, clear_ready, wait_ready
from gateway.launcher.up.backoff import Backoff
from gateway.launcher.up.fleet import ReplicaPorts
from gateway.launcher.up.processes import describe_exit, spawn, terminate

log = logging.getLogger("unitgate.up")


@dataclass(frozen=True, slots=True)
class Where:
    """Where a ready replica is, for the announcement."""

    index: int
    public_url: str
    metrics_url: str
    pid: int
    log: Path | None  # None: replica 0, logging to `up`'s own output


@dataclass(frozen=True, slots=True)
class ReplicaLauncher:
    """`unitgate replica` command lines: the config file replica 0 runs, and what differs."""

    config_path: Path
    log_dir: Path
    env: Mapping[str, str]
    log_level: str
    ready_within: float
    store_url: str | None  # the redis-server `up` started, or None: the config's own [state]
    log_format: str = "text"  # or json
    simulated: bool = False  # `up --simulated`: the replica plans the units as simulated ones
    kv_dir: Path | None = None  # the vLLM units' KV event sockets' folder (kv_events.py)

    def log_path(self, index: int) -> Path:
        return self.log_dir / f"replica-{index}.log"

    def ready_path(self, index: int) -> Path:
        return self.log_dir / f"replica-{index}.ready"

    def argv(self, ports: ReplicaPorts) -> list[str]:
        args = [
            *(sys.executable, "-m", "gateway", "replica", "--config", str(self.config_path)),
            *("--index", str(ports.index), "--port", str(ports.public)),
            *("--metrics-port", str(ports.metrics)),
            *("--ready-file", str(self.ready_path(ports.index))),
            *("--ready-within", f"{self.ready_within:g}", "--log-level", self.log_level),
            *("--log-format", self.log_format),
        ]
        if self.store_url is not None:
            args += ["--store-url", self.store_url]
        if self.simulated:
            args.append("--simulated")
        if self.kv_dir is not None:
            args += ["--kv-dir", str(self.kv_dir)]
        return args

    async def start(self, ports: ReplicaPorts) -> asyncio.subprocess.Process:
        await asyncio.to_thread(clear_ready, self.ready_path(ports.index))
        return await spawn(self.argv(ports), self.log_path(ports.index), self.env)


class ReplicaSupervisor:
    """One child replica: started, watched, restarted after a crash, stopped on `terminate`."""

    def __init__(
        self, ports: ReplicaPorts, launcher: ReplicaLauncher, backoff: Backoff, grace: float
    ) -> None:
        self.ports = ports
        self.log = launcher.log_path(ports.index)
        # Where it is once first ready, or its exit code if it exited before that.
        self.first_ready: asyncio.Future[Where | int] = asyncio.get_running_loop().create_future()
        self.restarts = 0
        self._launcher, self._backoff, self._grace = launcher, backoff, grace
        self._proc: asyncio.subprocess.Process | None = None
        self._stopping = asyncio.Event()

    async def run(self) -> None:
        """Until `terminate` (or a cancel): run it, and after a crash start it again. Returns
        at once if it exits before it was ever ready; the process is gone when this returns."""
        try:
            while not self._stopping.is_set():
                started = time.monotonic()
                self._proc = proc = await self._launcher.start(self.ports)
                if self._stopping.is_set():  # `terminate` came while it was being started
                    proc.terminate()
                log.info(
                    "replica %d started (pid %d, log %s)", self.ports.index, proc.pid, self.log
                )
                ready = asyncio.ensure_future(self._watch_ready(proc))
                try:
                    code = await proc.wait()
                finally:
                    ready.cancel()
                if not self.first_ready.done():
                    self.first_ready.set_result(code)
                    return
                if self._stopping.is_set():
                    return
                delay = self._backoff.delay(time.monotonic() - started)
                self.restarts += 1
                log.warning(
                    "replica %d (pid %d) exited with %s; restarting it in %.1f s (its log: %s)",
                    self.ports.index,
                    proc.pid,
                    describe_exit(code),
                    delay,
                    self.log,
                )
                with contextlib.suppress(TimeoutError):  # `terminate` cuts the wait short
                    await asyncio.wait_for(self._stopping.wait(), delay)
        finally:
            if self._proc is not None:
                await terminate(self._proc, self._grace)

    def terminate(self) -> None:
        """Start draining it now (SIGTERM); `run` returns once it exited, restarting nothing."""
        self._stopping.set()
        if self._proc is not None and self._proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.terminate()

    async def _watch_ready(self, proc: asyncio.subprocess.Process) -> None:
        path = self._launcher.ready_path(self.ports.index)
        try:
            info = await wait_ready(path, proc, float("inf"), f"replica {self.ports.index}")
        except NotReady:
            return  # it exited: `run` sees that
        where = Where(self.ports.index, info["public"], info["metrics"], proc.pid, self.log)
        if not self.first_ready.done():
            self.first_ready.set_result(where)
        else:
            log.info("replica %d (pid %d) is back at %s", where.index, proc.pid, where.public_url)
