"""Waiting for a child process's ready file: the simulated units and the gateway write their
bound addresses as JSON (atomically, by renaming a temporary file) once they listen, so a
harness reads ports the OS chose instead of guessing fixed ones. One poll, with a deadline and
the child's early exit both reported, for the benchmarks and the tests alike."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import orjson

POLL_S = 0.02


def wait_ready_file(
    path: Path, proc: subprocess.Popen[bytes], timeout: float = 30.0, what: str = "the process"
) -> dict[str, Any]:
    """The file's JSON once it exists; RuntimeError naming `what` if `proc` exits first or
    `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} before it was ready")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} not ready after {timeout:g} s (no {path})")
        time.sleep(POLL_S)
    data: dict[str, Any] = orjson.loads(path.read_bytes())
    return data
