"""Both relays run over the same upstream bytes, without sockets, for the equivalence tests.

`relay_reads` drives a real UpstreamConnection with stand-in transports: its reads are the
answer's bytes split where a test says (head, chunked framing and all); once the head is in,
the first bytes and the rest go through `pump.attach`, as the stream phase relays them (the
head alone is `StreamRelay.start`'s), with the pump the gateway uses: the Python one, or the
native Reader. What
reached the client and what the tracker, usage reader and connection were left with is the
`Outcome` the tests compare.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from gateway.observability.histogram import Histogram
from gateway.proxy.names import Renamer
from gateway.proxy.upstream import _ready
from gateway.relay.native import module
from gateway.relay.pump import attach
from gateway.relay.tracker import StreamTracker
from gateway.relay.usage import UsageReader
from gateway.upstream.connection import UpstreamConnection, tapped

SSE_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
# The client's response head, when a test has the pump send it (`relay_reads(lean=True)`).
CLIENT_HEAD = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"


def native() -> ModuleType:
    """The compiled relay: built here if need be (a test that needs it fails without it)."""
    return module()


class Clock:
    """The loop as the connection and the relay use it: its time, moving on each look."""

    def __init__(self) -> None:
        self.now = 1000.0

    def time(self) -> float:
        self.now += 0.001
        return self.now


class UnitSide:
    """The unit's transport: it only records what the gateway did to it."""

    def __init__(self) -> None:
        self.aborted = self.paused = False

    def get_extra_info(self, name: str, default: object = None) -> object:
        return default

    def abort(self) -> None:
        self.aborted = True

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False


class ClientSide:
    """The client's transport: keeps every write; `closing` and `buffered` play a client
    that left or reads slowly."""

    def __init__(self, closing_after: int | None = None, buffered: int = 0) -> None:
        self.writes: list[bytes] = []
        self.closing_after = closing_after
        self.buffered = buffered

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closing_after is not None and len(self.writes) >= self.closing_after

    def get_write_buffer_size(self) -> int:
        return self.buffered


@dataclass
class Outcome:
    writes: list[bytes]  # the pump's writes, each at most one HTTP chunk (with the head, the
    # last chunk around it: `unframe`)
    end: str  # complete | failed | gone | paused | broken | open | no-answer
    tracker: dict[str, Any]
    usage: tuple[int | None, int | None, str | None]
    gaps: int
    reusable: bool
    unit_aborted: bool
    pump: str = ""  # which relay ran: PythonPump or NativePump
    ended: bool = False  # the pump wrote the stream's last chunk


def chunked(body: bytes, sizes: list[int]) -> bytes:
    """`body` as HTTP/1.1 chunks of the given sizes (cycled), then the last chunk."""
    out, at, k = [], 0, 0
    while at < len(body):
        size = max(1, sizes[k % len(sizes)]) if sizes else len(body)
        out.append(b"%x\r\n%b\r\n" % (len(body[at : at + size]), body[at : at + size]))
        at += size
        k += 1
    return b"".join(out) + b"0\r\n\r\n"


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    """`data` cut at the given offsets (out of range or repeated ones are ignored)."""
    points = sorted({c for c in cuts if 0 < c < len(data)})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]


_CHUNK = re.compile(rb"([0-9a-f]+)\r\n")


def unframe(write: bytes) -> bytes:
    """One pump write's payload: the client's head may come first (once), the last chunk
    last, and at most one chunk between them."""
    write = write.removeprefix(CLIENT_HEAD)
    if not write:
        return b""
    match = _CHUNK.match(write)
    assert match is not None, write[:40]
    size = int(match.group(1), 16)
    body = write[match.end() : match.end() + size]
    rest = write[match.end() + size :]
    assert rest == b"\r\n" or (size and rest == b"\r\n0\r\n\r\n"), rest[:40]
    assert len(body) == size
    return body


def relay_reads(
    native_module: ModuleType | None,
    reads: list[bytes],
    *,
    tracked: bool = True,
    chat: bool = True,
    client_ids: bool = False,
    include_usage: bool = False,
    reads_usage: bool = False,
    served: str | None = None,
    client: ClientSide | None = None,
    lean: bool = False,
    tap: bool = True,
) -> Outcome:
    """Relay one answer that arrives as `reads`, with the native relay or (None) in Python.
    `served`: the unit's own name for the model "public" (its answers are renamed); `lean`:
    as the lean front has it, the pump sends the client's head (CLIENT_HEAD) and ends a
    cleanly ended stream itself. `tap`: the reads reach the connection through the protocol
    the pool connects it with (the native relay's Tap), else its own `data_received`."""
    loop = Clock()
    conn = UpstreamConnection(loop, native_module)  # type: ignore[arg-type]
    protocol = tapped(conn) if tap else conn
    unit = UnitSide()
    protocol.connection_made(unit)
    tracker = StreamTracker(chat, client_ids, include_usage, reads_usage) if tracked else None
    usage = None if tracked else UsageReader()
    names = Renamer(served, "public") if served is not None else None
    client = client or ClientSide()
    pending = iter(reads)
    for data in pending:  # the dispatcher's wait for the first bytes
        protocol.data_received(data)
        if conn.error is not None or _ready(conn):
            break
    else:
        protocol.connection_lost(None)
    if conn.error is not None or not _ready(conn):
        return _outcome(client, "no-answer", tracker, usage, Histogram(), conn, unit)
    first = b"".join(conn.body)  # what the dispatcher's Answer holds, relayed first
    conn.body.clear()
    gaps = Histogram()
    unsent = [first] if first else []
    head = CLIENT_HEAD if lean else b""
    pump = attach(conn, client, gaps, tracker, usage, names, False, unsent, head, lean)  # type: ignore[arg-type]
    for data in pending:
        if pump.settled() or conn.error is not None:
            break
        protocol.data_received(data)
    else:
        if not pump.settled() and conn.error is None:
            protocol.connection_lost(None)  # the unit closed after its last bytes
    pump.finish()
    if pump.gone:
        end = "gone"
    elif pump.failed:
        end = "failed"
    elif pump.done:
        end = "complete"
    elif pump.paused:
        end = "paused"
    elif conn.error is not None:
        end = "broken"
    else:
        end = "open"
    outcome = _outcome(client, end, tracker, usage, gaps, conn, unit)
    outcome.pump = type(pump).__name__
    outcome.ended = pump.ended
    return outcome


def _outcome(
    client: ClientSide,
    end: str,
    tracker: StreamTracker | None,
    usage: UsageReader | None,
    gaps: Histogram,
    conn: UpstreamConnection,
    unit: UnitSide,
) -> Outcome:
    state: dict[str, Any] = {}
    if tracker is not None:
        try:
            generated: object = list(tracker.generated)
        except ValueError:
            generated = "unparsable"
        state = {
            "generated": generated,
            "produced": tracker.produced,
            "committed": tracker.committed,
            "done": tracker.done,
            "error": tracker.error,
            "finish_reason": tracker.finish_reason,
            "prompt_ids": tracker.prompt_ids,
            "capable": tracker.capable,
            "template": tracker.template,
            "template_keys": list(tracker.template),  # their order is a continuation's
            "cached": tracker.cached,
        }
    read = (None, None, None) if usage is None else (usage.prompt, usage.completion, usage.error)
    return Outcome(
        client.writes,
        end,
        state,
        read,
        gaps.count,
        conn.reusable(),
        unit.aborted,
    )
