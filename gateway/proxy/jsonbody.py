"""Request bodies the gateway builds and keeps for a request's whole life.

orjson returns its output in the buffer it wrote it in, 4 KB or more even for a 100-byte body
(orjson 3.13 does not shrink it). A body kept for retries and resumption would then hold 4 KB
per open stream; `dumps` hands back a copy of the exact size instead.
"""

from __future__ import annotations

from typing import Any

import orjson


def dumps(obj: Any) -> bytes:
    """`obj` as JSON, in a bytes object no larger than it needs."""
    return memoryview(orjson.dumps(obj)).tobytes()
