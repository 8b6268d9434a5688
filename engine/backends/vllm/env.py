"""The process environment a vLLM node needs, set before vLLM is first imported.

vLLM reads most of its settings from environment variables once, at import, so they have to be
in `os.environ` before `import vllm`. An operator's own value always wins: these are defaults.
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
from collections.abc import MutableMapping

log = logging.getLogger(__name__)

SHM_PATTERN = "/dev/shm/vllm_*"  # vLLM's own names for its shared-memory buffers
# Python's multiprocessing names, which vLLM's message queues (psm_*) and locks (sem.mp-*) also
# use: a killed worker or resource tracker leaves them behind, 25-250 MB of RAM each.
MP_PATTERNS = ("/dev/shm/psm_*", "/dev/shm/sem.mp-*")


def node_defaults(rank: int, host: str, step_timeout: float) -> dict[str, str]:
    """Defaults for one node of a unit.

    - VLLM_HOST_IP: the address peers reach this node on (the unit's own network, never a
      guessed public interface).
    - VLLM_CPU_OMP_THREADS_BIND: one core per node, so two nodes on one machine do not fight
      over the same cores (only read by vLLM's CPU build).
    - VLLM_CPU_KVCACHE_SPACE: 1 GiB of KV cache instead of a share of RAM sized for servers.
    - HF_HUB_OFFLINE, VLLM_NO_USAGE_STATS, DO_NOT_TRACK: a node loads models by path and
      reports nothing to anyone.
    - VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS: how long the leader waits for a step's result from
      its workers; vLLM's 300 s default would leave a unit with a dead follower hanging for
      five minutes before the engine reports itself dead.
    """
    cores = os.cpu_count() or 1
    return {
        "VLLM_HOST_IP": host,
        "VLLM_CPU_OMP_THREADS_BIND": str(rank % cores),
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": str(max(1, round(step_timeout))),
    }


def apply_defaults(defaults: dict[str, str], environ: MutableMapping[str, str]) -> None:
    for key, value in defaults.items():
        environ.setdefault(key, value)


def clean_shm(since: float | None = None) -> int:
    """Remove shared-memory files vLLM left behind that no running process holds open.

    vLLM-named files go whatever their age. Files with Python's generic multiprocessing names
    go only when `since` is given and they were written at or after it (this node's start):
    nobody maps them any more, and they can only be this node's processes' or a peer's on this
    machine. A file still mapped by a live process (another unit here) is always left alone.
    """
    in_use = _held_inodes()
    candidates = glob.glob(SHM_PATTERN)
    if since is not None:
        candidates += [p for pattern in MP_PATTERNS for p in glob.glob(pattern) if _since(p, since)]
    removed = 0
    for path in candidates:
        with contextlib.suppress(FileNotFoundError, PermissionError, IsADirectoryError):
            if os.stat(path).st_ino in in_use:
                continue
            os.unlink(path)
            removed += 1
    if removed:
        log.info("removed %d stale shared-memory files", removed)
    return removed


def _since(path: str, since: float) -> bool:
    try:
        return os.stat(path).st_mtime >= since
    except OSError:
        return False


def _held_inodes() -> set[int]:
    """The inode of every /dev/shm file some process has open or mapped, from /proc.

    Inodes, not paths: glibc makes a named semaphore under a temporary name, links it to its
    `sem.*` name and removes the temporary one, so a process holding `sem.mp-*` maps a path
    /proc shows as `/dev/shm/sem.XXXXXX (deleted)`, never the name a cleanup finds. Compared
    by path, a live process's semaphore looked unused and was removed (another vLLM node's
    workers then failed to start, FileNotFoundError in SemLock._rebuild)."""
    held: set[int] = set()
    for pid in filter(str.isdigit, _listdir("/proc")):
        for fd in _listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("/dev/shm/"):
                    held.add(os.stat(f"/proc/{pid}/fd/{fd}").st_ino)
        with contextlib.suppress(OSError), open(f"/proc/{pid}/maps") as maps:
            for line in maps:
                if "/dev/shm/" in line:
                    held.add(int(line.split(None, 5)[4]))
    return held


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []
