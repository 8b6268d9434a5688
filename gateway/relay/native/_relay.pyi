"""The compiled relay, gateway.relay.native._relay (relay.c and the files it includes), as
gateway/relay/native/__init__.py loads it: its types, their methods and attributes, its constants.

tests/gateway/relay/test_native_stub.py holds these names to the built module's.
"""

import asyncio
from collections.abc import Sequence
from typing import Final, final

from _typeshed import ReadableBuffer

from gateway.relay.pump import Renamer
from gateway.relay.tracker import StreamTracker
from gateway.relay.usage import UsageReader
from gateway.upstream.connection import UpstreamConnection

# The flags `feed` and `relay` return (0: nothing for the caller to look at).
GONE: Final[int]  # the client's transport is closing: abort the unit's connection
FAILED: Final[int]  # the stream must break: the tracker's error, or `failure`
COMPLETE: Final[int]  # the answer ended (its last bytes are relayed or collected)
PAUSE: Final[int]  # the client's send buffer is above the high-water mark
BROKEN: Final[int]  # the body's framing is not HTTP: `error` says why; nothing relayed
JUNK: Final[int]  # bytes after the end of the answer: it stands, the connection goes
ENDED: Final[int]  # with COMPLETE: the last write also ended the client's stream
# The longest SSE event still incomplete before the stream breaks (8 MiB, as sse.py's).
MAX_EVENT: Final[int]

@final
class Reader:
    """One upstream answer's body: de-framed, and relayed once a relay attaches."""

    def __init__(self, mode: int, length: int = 0) -> None:
        """`mode`: 0 chunked, 1 a Content-Length of `length`, 2 until the close."""

    def feed(self, data: ReadableBuffer, now: float, /) -> int:
        """One read of the unit's bytes at the loop's time `now`, de-framed (and relayed once
        attached): the flags."""

    def relay(
        self,
        body: ReadableBuffer,
        complete: bool,
        now: float,
        counted: bool = True,
        head: ReadableBuffer = b"",
        /,
    ) -> int:
        """Bytes already de-framed, relayed: the flags. Not `counted`: an answer's first bytes,
        whose write is no gap between tokens; `head`: the response head, in the same write."""

    def end(self) -> bool:
        """The connection closed: True when that ends a close-delimited body."""

    def attach(
        self,
        client: asyncio.WriteTransport,
        tracker: StreamTracker | None,
        usage: UsageReader | None,
        names: Renamer | None,
        bounds: Sequence[float],
        high_water: int,
        now: float,
        chat: bool = False,
        client_ids: bool = False,
        tail: ReadableBuffer = b"",
        last_chunk: bool = False,
        read_usage: bool = False,
    ) -> None:
        """Relay to `client` from now on; `last_chunk`: a clean end writes the stream's last
        chunk (flag ENDED); `read_usage`: the usage chunk goes to the tracker's Python path
        (StreamTracker.reads_usage)."""

    def settle(self) -> None:
        """Write the counts kept here since the last look back to the tracker."""

    def gaps(self) -> tuple[list[int], float]:
        """The gaps between writes since attach: the count per bucket of `bounds`, their sum."""

    @property
    def error(self) -> str | None:
        """Why the body's framing is broken."""

    @property
    def failure(self) -> str | None:
        """Why a plain stream was broken here."""

    @property
    def body(self) -> list[bytes]:
        """Body pieces read before a relay attached."""

    @property
    def complete(self) -> bool:
        """The answer's body ended."""

    @property
    def mid_event(self) -> bool:
        """The last bytes written end inside an SSE event."""

    @mid_event.setter
    def mid_event(self, value: bool) -> None: ...
    @property
    def heard(self) -> float:
        """The loop's time of the last read."""

    @property
    def gap(self) -> float | None:
        """Running estimate of the gap between writes (None until a write is counted)."""

    @property
    def pending(self) -> int:
        """Bytes of an SSE event still incomplete."""

@final
class Tap:
    """Tap(conn): an UpstreamConnection's protocol, reading its answer's body in C."""

    def __init__(self, conn: UpstreamConnection) -> None: ...
    @property
    def conn(self) -> UpstreamConnection:
        """The UpstreamConnection this is the protocol of."""

    def data_received(self, data: bytes, /) -> None:
        """A read: the body's go to the connection's Reader here, the rest to the connection."""

    def connection_made(self, transport: asyncio.BaseTransport, /) -> None: ...
    def connection_lost(self, exc: Exception | None, /) -> None: ...
    def eof_received(self) -> bool | None: ...
    def pause_writing(self) -> None: ...
    def resume_writing(self) -> None: ...

def request_head(head: bytes, /) -> tuple[bytes, list[tuple[str, str]], int, bool] | None:
    """A request head of the common shape (heads.c) as (path, fields, length, keep_alive): the
    target up to its query, the fields in order (values without the whitespace around them);
    None: read it in Python."""

def response_head(buf: bytes, end: int, /) -> tuple[int, dict[bytes, bytes], bool] | None:
    """The response head `buf[:end]` of the common shape (heads.c) as (status, headers,
    keep_alive), headers as the connection keeps them; None: read it with httptools."""
