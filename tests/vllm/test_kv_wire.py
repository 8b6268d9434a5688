"""The gateway reads the KV event frames vLLM's own classes encode, as its publisher encodes them
(msgspec msgpack of a KVEventBatch), in both encodings: vLLM 0.32's (events as maps with a
"type" key) and the one before mid-2026 (events as positional arrays, the same classes with
`array_like=True`). Needs vLLM's event classes; starts no engine."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.kvevents.wire import Cleared, Removed, Stored, read_frame

pytestmark = [pytest.mark.vllm, pytest.mark.usefixtures("vllm_required")]


class OldStored(msgspec.Struct, array_like=True, omit_defaults=True, tag="BlockStored"):
    """BlockStored as vLLM encoded it before mid-2026: an array, the tag first."""

    block_hashes: list[bytes | int]
    parent_block_hash: bytes | int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None


class OldRemoved(msgspec.Struct, array_like=True, omit_defaults=True, tag="BlockRemoved"):
    block_hashes: list[bytes | int]
    medium: str | None


class OldCleared(msgspec.Struct, array_like=True, omit_defaults=True, tag="AllBlocksCleared"):
    pass


class OldBatch(msgspec.Struct, array_like=True, omit_defaults=True):
    ts: float
    events: list[OldStored | OldRemoved | OldCleared]
    data_parallel_rank: int | None = None


HASHES = st.lists(
    st.one_of(st.binary(min_size=32, max_size=32), st.integers(0, 2**64 - 1)),
    min_size=1,
    max_size=4,
)


@st.composite
def events(draw: st.DrawFn) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for _ in range(draw(st.integers(0, 5))):
        kind = draw(st.sampled_from(["stored", "removed", "cleared"]))
        hashes = draw(HASHES)
        size = draw(st.integers(1, 4))
        parent = draw(st.one_of(st.none(), st.integers(0, 2**64 - 1)))
        tokens = draw(
            st.lists(
                st.integers(0, 50_000), min_size=len(hashes) * size, max_size=len(hashes) * size
            )
        )
        out.append((kind, (hashes, parent, tokens, size)))
    return out


def frame(payload: bytes, seq: int) -> list[bytes]:
    return [b"", seq.to_bytes(8, "big"), payload]


def expected(made: list[tuple[str, Any]]) -> tuple[Any, ...]:
    out: list[Any] = []
    for kind, (hashes, parent, tokens, size) in made:
        if kind == "stored":
            out.append(Stored(tuple(hashes), parent, tuple(tokens), size))
        elif kind == "removed":
            out.append(Removed(tuple(hashes)))
        else:
            out.append(Cleared())
    return tuple(out)


@settings(max_examples=100, deadline=None)
@given(events(), st.integers(0, 2**40), st.booleans())
def test_vllms_own_batches_read_back(
    made: list[tuple[str, Any]], seq: int, per_block: bool
) -> None:
    """`per_block`: extra_keys as vLLM 0.32's engine sends them for a plain prompt, one None
    per block (no extra hash input: the blocks are keyed by their tokens alone)."""
    from vllm.distributed import kv_events  # .venv-vllm's (the vllm suite's venv)

    new, old = [], []
    for kind, (hashes, parent, tokens, size) in made:
        if kind == "stored":
            new.append(
                kv_events.BlockStored(
                    block_hashes=hashes,
                    parent_block_hash=parent,
                    token_ids=tokens,
                    block_size=size,
                    lora_id=None,
                    medium="CPU",
                    lora_name=None,
                    extra_keys=[None] * len(hashes) if per_block else None,
                )
            )
            old.append(OldStored(hashes, parent, tokens, size, None, "CPU"))
        elif kind == "removed":
            new.append(kv_events.BlockRemoved(block_hashes=hashes, medium="CPU"))
            old.append(OldRemoved(hashes, "CPU"))
        else:
            new.append(kv_events.AllBlocksCleared())
            old.append(OldCleared())
    encoder = msgspec.msgpack.Encoder()  # as ZmqEventPublisher encodes
    for payload in (
        encoder.encode(kv_events.KVEventBatch(ts=2.5, events=new, data_parallel_rank=0)),
        encoder.encode(OldBatch(ts=2.5, events=old)),
    ):
        batch = read_frame(frame(payload, seq))
        assert (batch.seq, batch.ts) == (seq, 2.5)
        assert batch.events == expected(made)
