"""Messages between the control plane and a worker: JSON objects, length-prefixed.

A socket pair per worker, created by the control plane before the worker starts (no path to
guess or secure, and either end sees EOF when the other dies).
"""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import orjson

_HEADER = struct.Struct(">I")
MAX_FRAME = 64 * 1024 * 1024  # a state message of thousands of units is far below this


class FrameError(Exception):
    """The peer sent something that is not a frame (a bug, or not our peer)."""


def encode(message: dict[str, Any]) -> bytes:
    body = orjson.dumps(message)
    return _HEADER.pack(len(body)) + body


async def read(reader: asyncio.StreamReader) -> dict[str, Any] | None:
    """The next message, or None at a clean EOF."""
    try:
        header = await reader.readexactly(_HEADER.size)
    except asyncio.IncompleteReadError as exc:
        if exc.partial:
            raise FrameError("EOF inside a frame header") from None
        return None
    (size,) = _HEADER.unpack(header)
    if size > MAX_FRAME:
        raise FrameError(f"frame of {size} bytes is over the {MAX_FRAME} limit")
    try:
        message = orjson.loads(await reader.readexactly(size))
    except asyncio.IncompleteReadError:
        raise FrameError("EOF inside a frame") from None
    except orjson.JSONDecodeError as exc:
        raise FrameError(f"frame is not JSON: {exc}") from None
    if not isinstance(message, dict) or not isinstance(message.get("t"), str):
        raise FrameError("frame is not a message object with a type")
    return message
