"""The units `unitgate up` runs beside its gateways: the builtin engine's, or simulated ones.

The command's order does not depend on which: units start first (they take longest), the
gateways come up while they load, and units stop after every gateway drained.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from gateway.launcher.up.backoff import Backoff
from gateway.launcher.up.plan import Plan
from gateway.launcher.up.processes import Launcher
from gateway.launcher.up.supervisor import UnitSupervisor

log = logging.getLogger("unitgate.up")


class UnitsFailed(RuntimeError):
    """The units could not start; the message says why and where the log is."""


class LocalUnits(Protocol):
    async def start(self) -> None:
        """Start them (UnitsFailed if that fails outright); `stop` is safe to call anyway."""

    async def stop(self) -> None: ...


class BuiltinUnits:
    """One supervisor task per unit, each restarting its unit as a whole (supervisor.py)."""

    def __init__(self, plan: Plan, launcher: Launcher) -> None:
        self._supervisors = [UnitSupervisor(unit, launcher, Backoff()) for unit in plan.units]
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        self._tasks = [
            asyncio.create_task(s.run(), name=f"unit-{s.plan.unit}") for s in self._supervisors
        ]

    async def stop(self) -> None:
        """Each supervisor stops its own unit when cancelled (leaders, then followers)."""
        for task in self._tasks:
            task.cancel()
        for result in await asyncio.gather(*self._tasks, return_exceptions=True):
            if isinstance(result, Exception):
                log.error("unit supervisor failed: %r", result)
