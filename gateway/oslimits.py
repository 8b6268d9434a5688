"""Process limits the gateway (and the simulator) raise at start."""

from __future__ import annotations

import contextlib
import resource


def raise_fd_limit() -> None:
    """Probers keep a connection per node (4,000 for 1,000 units of four nodes) on top of the
    client and upstream connections, far past the usual soft limit of 1,024 open files; the
    hard limit is ours to take."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # Best effort: an unlimited hard limit may not be grantable as a soft one.
    if soft != hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
