"""Ready files: a child (a gateway, a replica, the simulated units, a benchmark's relay)
writes its pid and bound addresses as JSON once it is ready (atomically: a temporary file
renamed), and its parent (`unitgate up`, a test, a benchmark) polls for it, reporting the
child's exit before that and a deadline. Ports chosen by the OS are read, never guessed.

Every writer and waiter of the project uses this module. `wait_ready` reads in a thread (the
parent's event loop may be serving traffic); `wait_ready_blocking` is for a synchronous
harness.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from pathlib import Path
from typing import Any

POLL_S = 0.05


class NotReady(RuntimeError):
    """The child exited, or was silent until the deadline; the message says which."""


def write_ready(path: Path, info: dict[str, Any]) -> None:
    """Written whole, then renamed into place: a waiter never reads half of it."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(info, indent=2))
    tmp.replace(path)


def read_ready(path: Path) -> dict[str, Any] | None:
    try:
        info: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    return info


def clear_ready(path: Path) -> None:
    path.unlink(missing_ok=True)


async def wait_ready(
    path: Path, proc: asyncio.subprocess.Process, within: float, what: str
) -> dict[str, Any]:
    """The file's JSON once it exists; NotReady naming `what` if `proc` exits first or
    `within` seconds pass."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while (info := await asyncio.to_thread(read_ready, path)) is None:
        if proc.returncode is not None:
            raise NotReady(f"{what} exited with {proc.returncode} before it was ready")
        if loop.time() > deadline:
            raise NotReady(f"{what} not ready after {within:g} s")
        await asyncio.sleep(POLL_S)
    return info


def wait_ready_blocking(
    path: Path, proc: subprocess.Popen[bytes], within: float, what: str
) -> dict[str, Any]:
    """`wait_ready` for a synchronous caller (a test, a benchmark): sleeps between polls."""
    deadline = time.monotonic() + within
    while (info := read_ready(path)) is None:
        if proc.poll() is not None:
            raise NotReady(f"{what} exited with {proc.returncode} before it was ready")
        if time.monotonic() > deadline:
            raise NotReady(f"{what} not ready after {within:g} s (no {path})")
        time.sleep(POLL_S)
    return info
