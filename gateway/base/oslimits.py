"""Process limits the gateway (and the simulator) raise at start."""

from __future__ import annotations

import contextlib
import resource

# What a process may open at most here; Linux's fs.nr_open caps it (1,048,576 by default).
WANTED = 1 << 20


def raise_fd_limit() -> None:
    """Probers keep a connection per node (4,000 for 1,000 units of four nodes) on top of the
    client and upstream connections (two per stream: 10,000 open streams are 20,000 files),
    far past the usual soft limit of 1,024 open files. The hard limit is ours to take, and a
    privileged process (CAP_SYS_RESOURCE) may raise the hard limit itself."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < WANTED:
        with contextlib.suppress(ValueError, OSError):  # not privileged: keep the hard limit
            resource.setrlimit(resource.RLIMIT_NOFILE, (WANTED, WANTED))
            return
    # Best effort: an unlimited hard limit may not be grantable as a soft one.
    if soft != hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


# Open files the gateway keeps apart from its streams: listeners, probe connections (one per
# node), the admin store, logs, and headroom for clients still being accepted.
RESERVED_FILES = 512


def stream_budget(nodes: int) -> int:
    """Streams the open-files limit allows at once: each holds a client and a unit connection."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 1 << 30
    return max(1, (soft - RESERVED_FILES - nodes) // 2)
