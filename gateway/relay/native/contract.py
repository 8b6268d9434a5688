"""The names the native relay's C uses on Python objects, declared in one place.

The C reads, writes and calls attributes of the gateway's own objects by name: relay.c interns
each name at module init, and the Tap finds two of the connection's slots by name to read them
by offset. Nothing else tells the Python side that C depends on them, so they are listed here,
per class, with what C does with each. tests/gateway/relay/test_native_contract.py checks
that each class has them and that the C sources name exactly these (and the keys and module
functions below), so renaming one on either side fails a test.

"Each sync" is the Reader reading the tracker's state: at the first read after `attach` and
after each call into the tracker's Python. The counts it keeps meanwhile are written back
before that Python runs, when a read returns flags, and at `settle`.
"""

from __future__ import annotations

from typing import Final

# gateway.relay.tracker.StreamTracker: a resumable stream's tracker (Reader.attach's `tracker`).
TRACKER: Final = (
    "done",  # read at each sync (events are skipped once done) and at the end; set at [DONE]
    "error",  # read at each sync (the stream breaks); set when an event passes MAX_EVENT
    "capable",  # read at each sync (True: the C token-chunk path); set True by the first event
    "continuing",  # read at each sync: a continuation's events go to the Python tracker
    "produced",  # read at each sync, counted on by token chunks, written back
    "committed",  # read at each sync, moved on by a token chunk with text, written back
    "unparsed",  # read at each sync (a bytearray): token chunks append their raw ids to it
    "finish_reason",  # set from a finish chunk the C path handles
    "template",  # set from the answer's first event (its id, object, created, model, ...)
    "prompt_ids",  # set from the answer's first event: an array('i') of the prompt's ids
    "_event",  # called with each event C does not handle: the bytes for the client
)

# gateway.relay.usage.UsageReader: a plain stream's usage reader (Reader.attach's `usage`).
USAGE: Final = (
    "_event",  # called with each event that names a usage that is not null
    "error",  # set when an event passes MAX_EVENT
)

# gateway.proxy.names.Renamer: the unit's model name to the public one (attach's `names`).
RENAMER: Final = (
    "feed",  # called with each read's body bytes: the bytes renamed
    "flush",  # called when the answer ends: the bytes it held back
)

# gateway.upstream.connection.UpstreamConnection: what the Tap is the protocol of (Tap(conn)).
CONNECTION: Final = (
    "loop",  # read at Tap(): its `time` dates each read
    "reader",  # read at each read (its slot): a Reader takes the read in C
    "events",  # read at each read without flags (its slot): None, no relay yet: Python hears
    "_native_flags",  # called with a read's flags when they need Python
    "data_received",  # called with each read while the connection has no Reader (the head)
    "connection_made",  # the Tap's own, forwarded
    "connection_lost",  # the Tap's own, forwarded
    "eof_received",  # the Tap's own, forwarded
    "pause_writing",  # the Tap's own, forwarded
    "resume_writing",  # the Tap's own, forwarded
)

# asyncio.WriteTransport: the client's transport (attach's `client`); looked up at attach.
CLIENT: Final = (
    "write",  # called with each write: the response head, a chunk, the last chunk
    "is_closing",  # called at each read: the client left (flag GONE)
    "get_write_buffer_size",  # called after each read without flags: above the mark, PAUSE
)

# asyncio.AbstractEventLoop: the connection's loop.
LOOP: Final = (
    "time",  # read at Tap(); called at each read
)

# Each class C touches (module.Class) and the names it uses on it.
TOUCHED: Final[dict[str, tuple[str, ...]]] = {
    "gateway.relay.tracker.StreamTracker": TRACKER,
    "gateway.relay.usage.UsageReader": USAGE,
    "gateway.proxy.names.Renamer": RENAMER,
    "gateway.upstream.connection.UpstreamConnection": CONNECTION,
    "asyncio.WriteTransport": CLIENT,
    "asyncio.AbstractEventLoop": LOOP,
}

# The connection's attributes the Tap reads by their slot's offset (no lookup per read): they
# must stay plain __slots__ entries, else each read looks them up by name.
SLOTS: Final = ("reader", "events")

# Keys of the answer's first event once parsed (a dict), not attributes; the template's keys
# are relay.c's TEMPLATE_KEYS, which are tracker.py's _TEMPLATE_KEYS in its order.
EVENT_KEYS: Final = ("choices", "prompt_token_ids")

# The functions relay.c takes from modules at init (first_event parses and writes with them).
MODULES: Final[dict[str, tuple[str, ...]]] = {
    "orjson": ("loads", "dumps"),
    "array": ("array",),
}
