"""Ready files between `unitgate up` and its children: a child writes its bound addresses as
JSON once it is ready (atomically: a temporary file renamed), and `up` polls for it, reporting
the child's exit before that and a deadline. Ports chosen by the OS are read, never guessed.

File access runs in a thread: the parent's event loop also serves replica 0's traffic.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

POLL_S = 0.05


class NotReady(RuntimeError):
    """The child exited, or was silent until the deadline; the message says which."""


def write_ready(path: Path, info: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(info))
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
