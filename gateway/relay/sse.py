"""Server-sent events cut out of a byte stream whose reads split them anywhere.

Only what resumption needs: whole events (so a half-received event is never relayed and then
continued by another unit) and their `data:` payload. Events end with a blank line; LF and
CRLF line ends are both accepted, as the SSE spec asks.
"""

from __future__ import annotations

import re

_EVENT_END = re.compile(rb"\r?\n\r?\n")

# An event still incomplete after this many bytes breaks its stream (it would only grow).
MAX_EVENT = 8 * 1024 * 1024
TOO_LONG = "the unit sent an SSE event longer than 8 MiB"


class EventSplitter:
    __slots__ = ("_tail",)

    def __init__(self) -> None:
        self._tail = b""

    def feed(self, data: bytes) -> list[bytes]:
        """The events completed by `data`, each with its terminating blank line."""
        buf = self._tail + data if self._tail else data
        if b"\r" not in buf:  # LF-only framing, what every engine sends: plain splits
            *whole, self._tail = buf.split(b"\n\n")
            return [event + b"\n\n" for event in whole]
        events: list[bytes] = []
        start = 0
        while (end := _EVENT_END.search(buf, start)) is not None:
            events.append(buf[start : end.end()])
            start = end.end()
        self._tail = buf[start:]
        return events

    def overflowed(self) -> bool:
        """Whether the partial event has grown past MAX_EVENT; if so it is dropped (its
        stream must break: it would only grow). Asked after each `feed`."""
        if len(self._tail) <= MAX_EVENT:
            return False
        self._tail = b""
        return True

    def take(self) -> bytes:
        """The partial event, handed over (to the native relay) and forgotten here."""
        tail, self._tail = self._tail, b""
        return tail

    def discard(self) -> None:
        """Drop a partial event: its stream broke, another unit will send the rest."""
        self._tail = b""

    @property
    def pending(self) -> int:
        return len(self._tail)


def data_of(event: bytes) -> bytes | None:
    """The event's data (its `data:` lines joined by LF), or None for comments/other fields."""
    lines = [line for line in event.splitlines() if line.startswith(b"data:")]
    if not lines:
        return None
    if len(lines) == 1:
        return _value(lines[0])
    return b"\n".join(_value(line) for line in lines)


def _value(line: bytes) -> bytes:
    value = line[5:]
    return value[1:] if value.startswith(b" ") else value
