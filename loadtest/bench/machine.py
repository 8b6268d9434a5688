"""What every benchmark records about the machine and the code it measured."""

from __future__ import annotations

import hashlib
import os
import platform
from pathlib import Path

from loadtest.bench.processes import CLK_TCK


def machine_facts() -> dict[str, object]:
    """The gateway source's digest, the host, the Python and the load average at start."""
    return {
        "gateway_source_sha256": _gateway_digest(),
        "nproc": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "clk_tck": CLK_TCK,
        "loadavg_at_start": os.getloadavg(),  # others' load on 2 cores skews everything
    }


def _gateway_digest() -> str:
    """The gateway is edited while benchmarks run; this ties numbers to the code measured."""
    import gateway

    digest = hashlib.sha256()
    for path in sorted(Path(gateway.__file__).parent.rglob("*.py")):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]
