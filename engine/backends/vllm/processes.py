"""A vLLM node's own child processes (engine core, workers), ended when the node ends.

vLLM starts its processes with multiprocessing and ends them on a clean shutdown; after a failed
start, a lost peer or a shutdown that timed out, some can be left waiting on a socket forever,
each holding gigabytes and shared memory. The node is their owner, so it reaps them before it
exits, whatever the path, and then removes the shared-memory files they left.
"""

from __future__ import annotations

import contextlib
import logging

import psutil

from engine.backends.vllm.env import clean_shm

log = logging.getLogger(__name__)


def reap_children(grace: float, since: float | None = None) -> None:
    """SIGTERM every descendant, SIGKILL those still there after `grace` seconds, then remove
    the shared memory left behind (see `clean_shm` for `since`).

    multiprocessing's resource tracker is left alone: it ignores SIGTERM by design, exits by
    itself once this process is gone, and on its way out unlinks what the others leaked.
    """
    try:
        children = [p for p in psutil.Process().children(recursive=True) if not _tracker(p)]
    except psutil.Error:
        children = []
    for child in children:
        with contextlib.suppress(psutil.Error):
            child.terminate()
    _, alive = psutil.wait_procs(children, timeout=grace)
    for child in alive:
        with contextlib.suppress(psutil.Error):
            child.kill()
    if alive:
        log.warning("killed %d vLLM processes that outlived the shutdown", len(alive))
        psutil.wait_procs(alive, timeout=grace)
    clean_shm(since)


def _tracker(process: psutil.Process) -> bool:
    try:
        return any("resource_tracker" in part for part in process.cmdline())
    except psutil.Error:
        return False
