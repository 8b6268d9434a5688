"""One supervisor task per local unit, with LeaderWorkerSet's restart policy: a unit is one
gang, so when ANY node exits, every node is stopped and the whole unit starts again.

A restarted follower could never rejoin the old group (its collectives and KV state are gone),
so restarting a single node would only leave a unit that looks alive and cannot step. While
the unit is down the gateway's probers take it out of routing; once it is back and its probes
pass, they put it back.
"""

from __future__ import annotations

import asyncio
import logging
import time

from gateway.base.ports import free_port
from gateway.launcher.up.backoff import Backoff
from gateway.launcher.up.plan import UnitPlan
from gateway.launcher.up.processes import Launcher, NodeProcess, describe_exit, stop_nodes

log = logging.getLogger("unitgate.up")


class UnitSupervisor:
    def __init__(
        self, plan: UnitPlan, launcher: Launcher, backoff: Backoff, grace: float = 5.0
    ) -> None:
        self.plan = plan
        self.nodes: list[NodeProcess] = []
        self.restarts = 0
        self._launcher, self._backoff, self._grace = launcher, backoff, grace

    async def run(self) -> None:
        """Until cancelled: start the unit, wait for a node to exit, stop the rest, back off.
        Cancelling stops the unit's processes before this returns."""
        try:
            while True:
                started = time.monotonic()
                await self._start()
                exited = await _first_exit(self.nodes)
                await stop_nodes(self.nodes, self._grace)
                delay = self._backoff.delay(time.monotonic() - started)
                self._log_restart(exited, delay)
                await asyncio.sleep(delay)
        finally:
            await stop_nodes(self.nodes, self._grace)

    async def _start(self) -> None:
        """Nodes are appended one by one, so a cancel in the middle still stops those started."""
        self.nodes = []
        master = f"{self.plan.leader.host}:{free_port(self.plan.leader.host)}"
        for spec in self.plan.nodes:
            self.nodes.append(await self._launcher.start(spec, master))
        pids = ", ".join(str(n.pid) for n in self.nodes)
        log.info("unit %s: started %d nodes (pids %s)", self.plan.unit, len(self.nodes), pids)

    def _log_restart(self, exited: NodeProcess, delay: float) -> None:
        self.restarts += 1
        log.warning(
            "unit %s: node %d (%s) exited with %s; restarting all %d nodes in %.1f s",
            self.plan.unit,
            exited.spec.rank,
            exited.spec.role,
            describe_exit(exited.proc.returncode),
            len(self.nodes),
            delay,
        )


async def _first_exit(nodes: list[NodeProcess]) -> NodeProcess:
    waits = {asyncio.ensure_future(n.proc.wait()): n for n in nodes}
    try:
        done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in waits:
            task.cancel()
    return waits[next(iter(done))]
