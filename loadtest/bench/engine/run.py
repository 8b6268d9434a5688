"""Start the measuring processes, wait for them with a deadline, and never leave one behind."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from loadtest.bench.processes import stop_child

JOB_TIMEOUT_S = 600.0


def run_group(name: str, argvs: Sequence[Sequence[str]], logs: Path) -> list[int]:
    """Run `python -m ...` processes together; all must exit 0 within JOB_TIMEOUT_S.
    Every process is stopped (terminate, then kill) in `finally`, whatever happened."""
    procs: list[subprocess.Popen[bytes]] = []
    files = []
    try:
        for i, argv in enumerate(argvs):
            log = (logs / f"{name}-{i}.log").open("wb")
            files.append(log)
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", *argv], stdout=log, stderr=subprocess.STDOUT
                )
            )
        deadline = time.monotonic() + JOB_TIMEOUT_S
        codes = []
        for proc in procs:
            codes.append(proc.wait(timeout=max(0.1, deadline - time.monotonic())))
        if any(codes):
            raise RuntimeError(f"{name}: exit codes {codes}; see {logs}/{name}-*.log")
        return codes
    finally:
        for proc in procs:
            stop_child(proc)
        for log in files:
            log.close()


def worker(job: str, result: Path, *extra: str) -> list[str]:
    return ["loadtest.bench.engine.worker", job, "--result", str(result), *extra]


def read(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def machine() -> dict[str, Any]:
    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "affinity": sorted(os.sched_getaffinity(0)),
        "torch_default_threads": torch.get_num_threads(),
        "loadavg_start": loadavg(),
    }
