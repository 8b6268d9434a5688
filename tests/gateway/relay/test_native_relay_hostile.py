"""The native relay fed hostile bytes by a unit: chunk sizes that lie, a huge chunk header, NUL
bytes, an event that never ends, and anything at all. It must not crash, must not hold more
than one event's bound of memory, and must break the stream with a clear error (the same
ending the Python relay comes to, where both can tell)."""

from __future__ import annotations

import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.relay.sse import MAX_EVENT, TOO_LONG
from gateway.upstream.connection import UpstreamConnection, tapped
from tests.gateway.relay.native_support import (
    SSE_HEAD,
    Clock,
    UnitSide,
    chunked,
    native,
    relay_reads,
    split,
)

CHUNKED = SSE_HEAD + b"transfer-encoding: chunked\r\n\r\n"
FIRST = b'data: {"n":1}\n\n'
START = CHUNKED + b"%x\r\n%b\r\n" % (len(FIRST), FIRST)


def broken_reason(reads: list[bytes]) -> str:
    """Feed a connection reading with the native relay; what broke it."""
    conn = UpstreamConnection(Clock(), native())  # type: ignore[arg-type]
    protocol = tapped(conn)  # as the pool connects it
    protocol.connection_made(UnitSide())
    for data in reads:
        protocol.data_received(data)
        if conn.error is not None:
            break
    return str(conn.error)


def test_a_chunk_longer_than_its_size_breaks_the_stream() -> None:
    reads = [START, b"3\r\ndata: x\n\n\r\n"]
    for relay in (None, native()):
        assert relay_reads(relay, reads, tracked=False).end == "broken"
    assert broken_reason(reads) == "invalid HTTP from the unit: a chunk longer than its size"


def test_a_chunk_size_bigger_than_what_comes_ends_as_a_reset() -> None:
    reads = [START, b"ffff\r\ndata: {}\n\n"]  # then the unit closes
    for relay in (None, native()):
        out = relay_reads(relay, reads, tracked=False)
        assert out.end == "broken" and out.writes and not out.reusable


def test_a_huge_chunk_header_is_refused_without_holding_it() -> None:
    digits = [START, b"1" * 1_000_000 + b"\r\n"]
    assert "too many digits" in broken_reason(digits)
    extension = [START, b"1;" + b"x" * 1_000_000 + b"\r\n"]
    assert "longer than 4096 bytes" in broken_reason(extension)
    for relay in (None, native()):
        assert relay_reads(relay, digits, tracked=False).end == "broken"
        assert relay_reads(relay, extension, tracked=False).end == "broken"


def test_nul_bytes_are_data_in_an_event_and_an_error_in_a_chunk_header() -> None:
    event = b'data: {"a":"\x00\x00"}\n\n'
    reads = [START, b"%x\r\n%b\r\n0\r\n\r\n" % (len(event), event)]
    py, nat = (relay_reads(relay, reads, tracked=False) for relay in (None, native()))
    assert nat.writes == py.writes and nat.end == py.end == "complete"
    assert "not hexadecimal" in broken_reason([START, b"\x001\r\n"])
    assert relay_reads(native(), [START, b"\x001\r\n"], tracked=False).end == "broken"


def test_an_event_that_never_ends_breaks_the_stream_within_its_bound() -> None:
    piece = b"data: " + b"x" * (64 * 1024 - 6)
    never = [START, *[chunked(piece, [len(piece)])[:-5] for _ in range(200)]]  # 12.5 MiB
    for tracked in (True, False):
        for relay in (None, native()):
            tracemalloc.start()
            out = relay_reads(relay, never, tracked=tracked)
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            assert out.end == "failed", (relay, tracked)
            assert (out.tracker.get("error") if tracked else out.usage[2]) == TOO_LONG
            # About one event's bound (and what the client got), not all the unit sent.
            relayed = sum(len(w) for w in out.writes)
            assert relayed < 1024 if tracked else relayed > MAX_EVENT
            assert peak - relayed < 2.2 * MAX_EVENT, peak


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    junk=st.binary(max_size=600),
    cuts=st.lists(st.integers(0, 700), max_size=12),
    tracked=st.booleans(),
    framing=st.sampled_from([b"transfer-encoding: chunked\r\n", b"content-length: 300\r\n", b""]),
)
def test_anything_after_the_head_is_relayed_refused_or_cut_never_a_crash(
    junk: bytes, cuts: list[int], tracked: bool, framing: bytes
) -> None:
    raw = SSE_HEAD + framing + b"\r\n" + FIRST + junk
    if framing.startswith(b"transfer"):
        raw = START + junk
    reads = split(raw, cuts)
    nat = relay_reads(native(), reads, tracked=tracked)
    assert nat.end in {"complete", "failed", "broken", "no-answer"}
    if framing.startswith(b"content-length") or not framing:
        # No chunk framing to disagree about: the two relays agree on every byte.
        py = relay_reads(None, reads, tracked=tracked)
        assert (nat.writes, nat.end, nat.tracker) == (py.writes, py.end, py.tracker)


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(st.text(alphabet="0123456789abcdefABCDEF;= \t\r\nx\x00", max_size=12)),
    cuts=st.lists(st.integers(0, 200), max_size=10),
)
def test_garbled_chunk_headers_never_crash(sizes: list[str], cuts: list[int]) -> None:
    raw = START + b"".join(s.encode() + b"\r\n" + FIRST + b"\r\n" for s in sizes)
    out = relay_reads(native(), split(raw, cuts), tracked=True)
    assert out.end in {"complete", "failed", "broken", "open", "no-answer"}


def test_relaying_before_a_client_is_attached_is_refused_not_a_crash() -> None:
    reader = native().Reader(0)
    with pytest.raises(RuntimeError, match="before attach"):
        reader.relay(b"data: x\n\n", False, 1.0)
    with pytest.raises(AttributeError):  # a client without a transport's methods
        reader.attach(object(), None, None, None, (0.1,), 1024, 1.0)
    with pytest.raises(RuntimeError, match="before attach"):
        reader.relay(b"data: x\n\n", False, 1.0)
