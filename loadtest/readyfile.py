"""Waiting for a child process's ready file: the simulated units and the gateway write their
bound addresses as JSON (atomically, by renaming a temporary file) once they listen, so a
harness reads ports the OS chose instead of guessing fixed ones. One poll, with a deadline and
the child's early exit both reported, for the benchmarks and the tests alike."""

from __future__ import annotations

import subprocess
import time
import urllib.error
import urllib.request
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


def wait_http_ok(
    url: str, proc: subprocess.Popen[bytes], timeout: float = 30.0, what: str = "the process"
) -> None:
    """Poll `url` until it answers 200: a gateway's ready file says it listens, its `/readyz`
    says it can route (its units are unknown until a probe round has judged them)."""
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} before {url} said 200")
        try:
            with urllib.request.urlopen(url, timeout=1.0) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass  # 503 (not ready yet) is an HTTPError, a URLError
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: {url} did not answer 200 within {timeout:g} s")
        time.sleep(POLL_S)
