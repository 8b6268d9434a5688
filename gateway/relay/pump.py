"""Moving one answer's bytes from its upstream connection to the client, read by read.

`attach` starts it once the head has gone out: `PythonPump` when the connection parses with
httptools (each read's body pieces pass through the renamer, the usage reader and the tracker
in Python), `NativePump` when the connection's native Reader does all of that in one compiled
call per read and only tells this of what needs Python. Either leaves its ending in the same
four flags (`Pump`), which the request task (relay.py's StreamRelay) waits on.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from gateway.base.net import LAST_CHUNK
from gateway.relay.pace import GapSink, next_gap
from gateway.relay.tracker import StreamTracker
from gateway.relay.usage import UsageReader
from gateway.upstream.connection import UpstreamConnection


class Renamer(Protocol):
    """What the relay asks of the unit's model name being put back to the public one
    (proxy/names.py's Renamer): each read's bytes, then what it held back at the end."""

    def feed(self, data: bytes) -> bytes: ...

    def flush(self) -> bytes: ...


# Pause reading from the unit while the client has this much unsent data.
HIGH_WATER = 256 * 1024


class Pump:
    """How one answer's relaying stands, read by the request task: it is done (complete),
    the client is gone, the client's buffer is full (paused), or the stream failed; `ended`:
    its last write also ended the client's stream (the chunked coding's last chunk)."""

    __slots__ = ("done", "ended", "failed", "gone", "paused")

    def __init__(self) -> None:
        self.done = self.gone = self.paused = self.failed = self.ended = False

    def settled(self) -> bool:
        return self.done or self.gone or self.paused or self.failed


class PythonPump(Pump):
    """Called by the upstream connection for every read; writes to the client at once.

    With a tracker (a resumable stream) the bytes pass through it first: only whole events
    reach the client, and an error event from the unit breaks the stream like a reset."""

    __slots__ = (
        "client",
        "conn",
        "gap",
        "head",
        "itl",
        "last",
        "last_chunk",
        "loop",
        "mid_event",
        "names",
        "tracker",
        "usage",
    )

    def __init__(
        self,
        conn: UpstreamConnection,
        client: asyncio.Transport,
        itl: GapSink,
        tracker: StreamTracker | None,
        names: Renamer | None = None,
        usage: UsageReader | None = None,
        head: bytes = b"",
        last_chunk: bool = False,
    ) -> None:
        self.conn = conn
        self.names = names
        self.usage = usage
        self.client = client
        self.itl = itl
        self.tracker = tracker
        self.loop = conn.loop
        self.last = self.loop.time()
        self.gap: float | None = None  # running estimate of this stream's gap between reads
        self.head = head  # the response head, still to go out with the first write
        self.last_chunk = last_chunk  # a clean end also writes the stream's last chunk
        super().__init__()
        self.mid_event = False  # the last bytes written end inside an SSE event

    def push(self, pieces: list[bytes], complete: bool, counted: bool = True) -> None:
        """Relay what a read brought (`complete`: the answer ended) in one write to the
        client, with the response head before it if that is still to go out, and the last
        chunk after it at a clean end (`last_chunk`). Not `counted`: an answer's first bytes,
        whose write is no gap between tokens (it is the answer's TTFT)."""
        if self.client.is_closing():
            self.gone = True
            self.conn.abort()
            self.conn.wake()
            return
        failed = False
        out = b""
        if pieces or (complete and self.names is not None):
            data = pieces[0] if len(pieces) == 1 else b"".join(pieces)
            if self.names is not None:
                data = self.names.feed(data)
                if complete:
                    data += self.names.flush()
            if self.usage is not None:
                self.usage.feed(data)
            if self.tracker is not None:
                data = self.tracker.feed(data)
            if data:
                out = b"%x\r\n%b\r\n" % (len(data), data)
                self.mid_event = not data.endswith(b"\n\n")
            failed = (self.tracker is not None and self.tracker.error is not None) or (
                self.usage is not None and self.usage.error is not None
            )
        self.ended = (
            complete
            and self.last_chunk
            and not failed
            and (self.tracker is None or self.tracker.done)
        )
        if self.head or self.ended:
            self.client.write(self.head + out + LAST_CHUNK if self.ended else self.head + out)
            self.head = b""
        elif out:
            self.client.write(out)
        if out:
            now = self.loop.time()
            if counted:
                gap = now - self.last
                self.itl.observe(gap)
                self.gap = next_gap(self.gap, gap)
            self.last = now
        if failed:
            # Settled here, not through conn.fail(): that ignores errors once the answer
            # is complete, and the error event often comes in the same read as its end.
            self.failed = True
            self.conn.abort()
            self.conn.wake()
            return
        if complete:
            self.done = True
            self.conn.wake()
        elif self.client.get_write_buffer_size() > HIGH_WATER:
            assert self.conn.transport is not None
            self.conn.transport.pause_reading()
            self.paused = True
            self.conn.wake()

    def finish(self) -> None:
        """The answer was relayed (its gaps are in the sink already)."""


class NativePump(Pump):
    """The native Reader relays every read itself; this hears only of the reads that need
    Python (flags: the client left, the stream broke, the answer ended, the client's buffer
    is full), and reads the Reader's pace. Its gap buckets go to the sink at the end."""

    __slots__ = ("conn", "itl", "native", "reader")

    def __init__(self, conn: UpstreamConnection, itl: GapSink) -> None:
        self.conn, self.itl = conn, itl
        reader, native = conn.reader, conn.native
        assert reader is not None and native is not None
        self.reader, self.native = reader, native
        super().__init__()

    def on_flags(self, flags: int) -> None:
        native, conn = self.native, self.conn
        if flags & native.GONE:
            self.gone = True
            conn.abort()
        elif flags & native.FAILED:
            self.failed = True
            conn.abort()
        elif flags & native.COMPLETE:
            self.done = True
            self.ended = bool(flags & native.ENDED)
        elif flags & native.PAUSE:
            assert conn.transport is not None
            conn.transport.pause_reading()
            self.paused = True
        conn.wake()

    @property
    def gap(self) -> float | None:
        return self.reader.gap

    @property
    def last(self) -> float:
        """The time of the last read (every write follows one), which the Tap (the connection's
        protocol) keeps in the Reader, not in the connection's `last_data`."""
        return self.reader.heard

    @property
    def mid_event(self) -> bool:
        return self.reader.mid_event

    def finish(self) -> None:
        self.reader.settle()  # the tracker's counts, kept in the Reader between reads
        counts, total = self.reader.gaps()
        if total or any(counts):
            self.itl.merge(counts, total)


# What `attach` returns: either pump, with its pace (`gap`, `last`, `mid_event`) and `finish`.
AnyPump = PythonPump | NativePump


def attach(
    conn: UpstreamConnection,
    client: asyncio.Transport,
    itl: GapSink,
    tracker: StreamTracker | None,
    usage: UsageReader | None,
    names: Renamer | None,
    mid_event: bool,
    pending: list[bytes],
    head: bytes = b"",
    last_chunk: bool = False,
) -> AnyPump:
    """Start relaying `conn`'s answer to `client` from now on, with what already came
    (`pending`, then what the connection holds): the native relay when the connection reads
    with it, else the Python one. `pending` is an answer's first bytes, not yet sent (the
    native relay's first answer, any continuation): their write is no gap between tokens.
    `mid_event`: the client's stream so far ends mid-event. `head`: the response head, not
    yet sent: it goes out now, in one write with the first bytes when there are any.
    `last_chunk`: a clean end writes the stream's last chunk with the answer's last bytes
    (the pump's `ended` then says so), where the client's connection is this front's own."""
    pump: AnyPump
    reader = conn.reader
    if reader is None:
        pump = PythonPump(conn, client, itl, tracker, names, usage, head, last_chunk)
        pump.mid_event = mid_event
        conn.sink = pump.push
        if conn.body or conn.complete or pending:  # arrived while the head was being sent
            pieces, conn.body = pending + conn.body, []
            pump.push(pieces, conn.complete, not pending)
        elif head and not client.is_closing():
            client.write(head)
            pump.head = b""
        return pump
    # When the Python path sent the first bytes, an event they left incomplete goes on here.
    splitter = tracker.splitter if tracker is not None else usage.splitter if usage else None
    reader.attach(
        client,
        tracker,
        usage,
        names,
        itl.bounds,
        HIGH_WATER,
        conn.loop.time(),
        tracker is not None and tracker.chat,
        tracker is not None and tracker.client_ids,
        splitter.take() if splitter is not None else b"",
        last_chunk,
        tracker is not None and tracker.reads_usage,
    )
    reader.mid_event = mid_event
    pump = NativePump(conn, itl)
    conn.events = pump.on_flags
    if conn.body or conn.complete or pending:
        data, conn.body = b"".join(pending + conn.body), []
        flags = reader.relay(data, conn.complete, conn.loop.time(), not pending, head)
        if flags:
            pump.on_flags(flags)
    elif head and not client.is_closing():
        client.write(head)
    return pump
