"""Stopping tasks at shutdown: cancel, then wait, but never forever.

A task can swallow its cancellation (redis-py's calls may, its pub/sub reads do) and go on; a
shutdown must not hang on it. So a stop waits a bounded time, says which task it left behind,
and retrieves the failures of those that ended, so none is logged as never retrieved.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any


async def end(*tasks: asyncio.Task[Any], within: float, log: logging.Logger) -> None:
    """Cancel `tasks` and wait up to `within` seconds for them to end."""
    if not tasks:
        return
    for task in tasks:
        task.cancel()
    done, stuck = await asyncio.wait(tasks, timeout=within)
    for task in stuck:
        log.warning("%s did not stop within %g s: left behind", task.get_name(), within)
    for task in done:
        if not task.cancelled():
            task.exception()
