"""The running event loop, kept by an object that asks for it on every request.

`asyncio.get_running_loop()` asks the OS for the process id on each call (CPython 3.11 checks
that the loop was not inherited across a fork); the request path asked about ten times a
request. An object that lives in one loop (a gateway's handler, dispatcher, admission, its
observers, a client connection) keeps the loop it first finds running:

    loop = self._loop or self._bind_loop()
"""

from __future__ import annotations

import asyncio


class KeepsLoop:
    """Mixin: `_bind_loop` finds the running loop once and keeps it in `_loop` (a slot here:
    a slotted class gains no instance dict), which the class sets to None in its `__init__`."""

    __slots__ = ("_loop",)
    _loop: asyncio.AbstractEventLoop | None

    def _bind_loop(self) -> asyncio.AbstractEventLoop:
        self._loop = loop = asyncio.get_running_loop()
        return loop
