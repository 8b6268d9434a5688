"""Chaos suite fixtures and its summary: one markdown table of every scenario's numbers,
printed at the end of the run and written to `<pytest basetemp>/chaos-report.md` (and to
`$UNITGATE_CHAOS_REPORT` when set)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.chaos.clusters import WORKERS, GatewayProcess, start_gateway, start_simulator
from tests.chaos.harness import RESUME_ON
from tests.chaos.report import HEADER, ROWS
from tests.chaos.simulated import paced
from tests.support import MODEL, SimProcess, stop_process


@pytest.fixture(scope="module")
def simulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimProcess]:
    """Three simulated units of two nodes each, in one process (their faults are controls)."""
    sim = start_simulator(tmp_path_factory.mktemp("chaos-sim"))
    try:
        yield sim
    finally:
        stop_process(sim.proc)


@pytest.fixture
def sim(simulator: SimProcess) -> SimProcess:
    """The module's simulator, faults cleared, every unit streaming 20 ms apart."""
    return paced(simulator, ttft_ms=20, itl_ms=20)


@pytest.fixture
def gateway(sim: SimProcess, tmp_path: Path) -> Iterator[GatewayProcess]:
    """A fresh gateway process per scenario (metrics and events start at zero), routing."""
    gw = start_gateway(tmp_path, sim, MODEL, gateway={"workers": WORKERS})
    try:
        yield gw
    finally:
        gw.close()


@pytest.fixture
def two_workers(sim: SimProcess, tmp_path: Path) -> Iterator[GatewayProcess]:
    """A fresh gateway process with a control plane and two workers, whatever WORKERS says."""
    gw = start_gateway(tmp_path, sim, MODEL, gateway={"workers": 2})
    try:
        yield gw
    finally:
        gw.close()


def _number(row: str) -> int:
    match = re.match(r"\| (\d+)\.", row)
    return int(match.group(1)) if match else 99


def table() -> str:
    if RESUME_ON:
        resume = "on (the in-flight share of scenarios 1-3 is asserted >= 99%)"
    else:
        resume = "switched off by UNITGATE_CHAOS_RESUME=0 (in-flight share of 1-3 not asserted)"
    rows = "\n".join(sorted(ROWS, key=_number))
    return f"{HEADER}\n{rows}\n\nmid-stream resumption: {resume}\n"


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, exitstatus: int, config: pytest.Config
) -> None:
    if not ROWS:
        return
    text = table()
    paths = [config._tmp_path_factory.getbasetemp() / "chaos-report.md"]  # type: ignore[attr-defined]
    if extra := os.environ.get("UNITGATE_CHAOS_REPORT"):
        paths.append(Path(extra))
    for path in paths:
        path.write_text(text)
    terminalreporter.write_sep("=", "chaos suite")
    terminalreporter.write(text)
    terminalreporter.write_line(f"(written to {', '.join(str(p) for p in paths)})")
