"""vLLM's KV event frames read in both encodings: events as maps with a "type" key (vLLM since
mid-2026) and as positional arrays (before), with and without the fields added over time; and
frames that are not of the format refused with a reason. (tests/vllm/test_kv_wire.py reads
frames vLLM's own event classes encode.)"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.kvevents.wire import (
    Cleared,
    Removed,
    Stored,
    WireError,
    read_batch,
    read_event,
    read_frame,
    seq_of,
)

SHA = b"\x01" * 32


def encode(ts: float, events: list[Any], rank: int | None = None) -> bytes:
    return msgspec.msgpack.encode([ts, events, rank])


def as_map(kind: str, **fields: Any) -> dict[str, Any]:
    return {"type": kind, **fields}


def test_maps_and_arrays_read_alike() -> None:
    stored = Stored((SHA, 7), None, (1, 2, 3, 4), 2)
    maps = [
        as_map(
            "BlockStored",
            block_hashes=[SHA, 7],
            parent_block_hash=None,
            token_ids=[1, 2, 3, 4],
            block_size=2,
            lora_id=None,
            medium="CPU",
            lora_name=None,
        ),
        as_map("BlockRemoved", block_hashes=[7], medium="CPU"),
        as_map("AllBlocksCleared"),
    ]
    arrays = [
        ["BlockStored", [SHA, 7], None, [1, 2, 3, 4], 2, None, "CPU"],
        ["BlockRemoved", [7], "CPU"],
        ["AllBlocksCleared"],
    ]
    for events in (maps, arrays):
        frame = [b"", (5).to_bytes(8, "big"), encode(1.5, events)]
        batch = read_frame(frame)
        assert (batch.seq, batch.ts) == (5, 1.5)
        assert batch.events == (stored, Removed((7,)), Cleared())


def test_the_oldest_arrays_and_the_newest_fields() -> None:
    """Arrays without medium (vLLM's first format); maps with extra keys and a group."""
    old = read_event(["BlockStored", [3], 9, [5, 6], 2])
    assert old == Stored((3,), 9, (5, 6), 2)
    new = read_event(
        as_map(
            "BlockStored",
            block_hashes=[3],
            parent_block_hash=None,
            token_ids=[5, 6],
            block_size=2,
            extra_keys=[["salt"]],
            group_idx=1,
            session_id="s",
        )
    )
    assert new == Stored((3,), None, (5, 6), 2, extra=True, group=1)
    assert read_event(["BlockStored", [3], None, [5, 6], 2, None, "CPU", "adapter"]).extra


def test_extra_keys_of_none_per_block_are_no_extra() -> None:
    """vLLM 0.32 sends `extra_keys` for every stored batch, one entry per block, None where
    the block's hash took nothing but its tokens: a plain prompt's blocks, keyed plainly."""
    plain = as_map(
        "BlockStored",
        block_hashes=[3, 4],
        parent_block_hash=None,
        token_ids=[5, 6, 7, 8],
        block_size=2,
        extra_keys=[None, None],
    )
    assert not read_event(plain).extra
    assert read_event({**plain, "extra_keys": [None, ["salt"]]}).extra


@given(
    st.lists(st.one_of(st.binary(min_size=1, max_size=32), st.integers(0, 2**64 - 1)), min_size=1),
    st.integers(1, 4),
    st.booleans(),
)
def test_any_stored_event_reads_back(hashes: list[Any], size: int, positional: bool) -> None:
    tokens = list(range(len(hashes) * size))
    fields = [hashes, None, tokens, size, None, "CPU"]
    raw: Any = ["BlockStored", *fields]
    if not positional:
        names = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id")
        raw = as_map("BlockStored", **dict(zip((*names, "medium"), fields, strict=True)))
    batch = read_batch(0, encode(0.0, [raw]))
    assert batch.events == (Stored(tuple(hashes), None, tuple(tokens), size),)


@pytest.mark.parametrize(
    ("payload", "why"),
    [
        (b"\xc1", "not msgpack"),
        (msgspec.msgpack.encode({"ts": 1}), "an array"),
        (encode(1.0, [["Unknown"]]), "unknown event type"),
        (
            encode(1.0, [as_map("BlockStored", block_hashes=[1], token_ids=[1], block_size=2)]),
            "1 token ids for 1 blocks of 2",
        ),
        (encode(1.0, [as_map("BlockRemoved", block_hashes=["x"])]), "bytes or integers"),
        (
            encode(1.0, [as_map("BlockStored", block_hashes=[1], token_ids=[1], block_size=0)]),
            "positive integer",
        ),
        (encode(1.0, ["x"]), "a map or an array, not str"),
        (encode(1.0, [3]), "a map or an array"),
    ],
)
def test_what_is_not_the_format_is_refused_with_a_reason(payload: bytes, why: str) -> None:
    with pytest.raises(WireError, match=why):
        read_batch(0, payload)


def test_frames_and_sequence_numbers() -> None:
    assert seq_of((-1).to_bytes(8, "big", signed=True)) == -1  # a replay's end
    with pytest.raises(WireError, match="8 bytes"):
        seq_of(b"\x00")
    with pytest.raises(WireError, match="3 frames"):
        read_frame([b"", b"\x00" * 8])
