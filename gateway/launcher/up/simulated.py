"""`unitgate up --simulated`: the config's units as simulated units (a test tool), one
`python -m loadtest.simunits --from-config` process serving every node at its URL.

The simulator is handed the units as `up` loaded them, environment overrides applied
(`UNITGATE__UNITS__1__LEADER=...` moves the simulated unit too), not the config file: it
writes them as `[[units]]` tables (id, leader, nodes: what `--from-config` reads) to
`simulated-units.toml` in the log dir, beside the simulator's log and ready file.

Started like every child of `up` (own session, killed if `up` dies) and waited for through its
ready file before any gateway starts, so a simulator that cannot bind a unit's port fails the
run at once, naming its log, instead of leaving the gateways to time out.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from gateway.api import UnitConfig
from gateway.base.readyfile import NotReady, clear_ready, wait_ready
from gateway.launcher.up.processes import log_tail, spawn, terminate
from gateway.launcher.up.units import UnitsFailed

log = logging.getLogger("unitgate.up")
READY_WITHIN_S = 30.0


def units_toml(units: Sequence[UnitConfig]) -> str:
    """The units in the `[[units]]` form the simulator reads (it takes a file's tables, not the
    gateway's checked config). A JSON string is a TOML basic string: same quotes and escapes."""
    blocks = [
        f"[[units]]\nid = {json.dumps(u.id)}\nleader = {json.dumps(u.leader)}\n"
        f"nodes = [{', '.join(json.dumps(n) for n in u.nodes)}]\n"
        for u in units
    ]
    return "\n".join(blocks)


class SimulatedUnits:
    def __init__(self, units: Sequence[UnitConfig], log_dir: Path, env: Mapping[str, str]) -> None:
        self.log = log_dir / "simulated-units.log"
        self.units_file = log_dir / "simulated-units.toml"
        self._ready = log_dir / "simulated-units.ready"
        self._units, self._env = tuple(units), env
        self._proc: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        await asyncio.to_thread(self._prepare)
        argv = [sys.executable, "-m", "loadtest.simunits", "--from-config", str(self.units_file)]
        self._proc = await spawn([*argv, "--ready-file", str(self._ready)], self.log, self._env)
        try:
            info = await wait_ready(self._ready, self._proc, READY_WITHIN_S, "the simulated units")
        except NotReady as exc:
            tail = await asyncio.to_thread(log_tail, self.log)
            raise UnitsFailed(f"{exc} (its log: {self.log}){tail}") from None
        log.info(
            "simulated units (pid %d) serving, their control API (faults) at %s; their log: %s",
            self._proc.pid,
            info.get("control"),
            self.log,
        )

    def _prepare(self) -> None:
        clear_ready(self._ready)
        self.units_file.write_text(units_toml(self._units), encoding="utf-8")

    async def stop(self, grace: float = 5.0) -> None:
        if self._proc is not None:
            await terminate(self._proc, grace)
