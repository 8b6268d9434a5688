"""`unitgate up --simulated --replicas N`: the config's units as simulated units (a test tool),
one `python -m loadtest.simunits --from-config` process serving every node at its URL.

Started like every child of `up` (own session, killed if `up` dies) and waited for through its
ready file before any gateway starts, so a simulator that cannot bind a unit's port fails the
run at once, naming its log, instead of leaving the gateways to time out.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Mapping
from pathlib import Path

from gateway.base.readyfile import NotReady, clear_ready, wait_ready
from gateway.launcher.up.processes import spawn, terminate
from gateway.launcher.up.units import UnitsFailed

log = logging.getLogger("unitgate.up")
READY_WITHIN_S = 30.0


class SimulatedUnits:
    def __init__(self, config_path: Path, log_dir: Path, env: Mapping[str, str]) -> None:
        self.log = log_dir / "simulated-units.log"
        self._ready = log_dir / "simulated-units.ready"
        self._config_path, self._env = config_path, env
        self._proc: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        await asyncio.to_thread(clear_ready, self._ready)
        argv = [sys.executable, "-m", "loadtest.simunits", "--from-config", str(self._config_path)]
        self._proc = await spawn([*argv, "--ready-file", str(self._ready)], self.log, self._env)
        try:
            await wait_ready(self._ready, self._proc, READY_WITHIN_S, "the simulated units")
        except NotReady as exc:
            raise UnitsFailed(f"{exc} (its log: {self.log})") from None
        log.info("simulated units (pid %d) serving; their log: %s", self._proc.pid, self.log)

    async def stop(self, grace: float = 5.0) -> None:
        if self._proc is not None:
            await terminate(self._proc, grace)
