"""vLLM's KV cache events as they come off its ZMQ publisher, read into plain values.

A frame is `[topic, seq, payload]`: `seq` an 8-byte big-endian sequence number, `payload` a
msgpack `EventBatch`, an array `[ts, events, data_parallel_rank?]`. vLLM has encoded each event
two ways, and a subscriber must read both (one that read one broke on the other elsewhere):
- as a map with a `"type"` key (vLLM since mid-2026: `{"type": "BlockStored", "block_hashes":
  [...], ...}`);
- as a positional array, the type's name first (before: `["BlockStored", block_hashes,
  parent_block_hash, token_ids, block_size, lora_id, medium, ...]`).
Fields added later (medium, LoRA names, extra keys, group index) may be absent from either.
An engine's block hash is bytes (sha256) or an int (`VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`);
it is only ever compared, never computed here (keys.py computes the gateway's own).

Pure: no sockets (reading the publisher is another module's job). A frame that is not of
this shape raises WireError saying what is wrong with it.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeGuard

import msgspec

EngineHash = bytes | int


class WireError(ValueError):
    """A frame or event that is not vLLM's KV event format."""


@dataclass(frozen=True, slots=True)
class Stored:
    """Blocks the engine cached: `block_hashes[i]` holds `token_ids[i*block_size:][:block_size]`,
    the first one's parent being `parent` (None: the first block of a prompt)."""

    block_hashes: tuple[EngineHash, ...]
    parent: EngineHash | None
    token_ids: tuple[int, ...]
    block_size: int
    # What else the engine mixed into the blocks' hashes (a LoRA adapter, multimodal inputs,
    # a cache salt): such blocks never match a plain request's.
    extra: bool = False
    group: int = 0  # the KV cache group (hybrid models have several)


@dataclass(frozen=True, slots=True)
class Removed:
    block_hashes: tuple[EngineHash, ...]
    group: int = 0


@dataclass(frozen=True, slots=True)
class Cleared:
    """Every block of the engine's cache is gone (a reset)."""


Event = Stored | Removed | Cleared


@dataclass(frozen=True, slots=True)
class Batch:
    seq: int
    ts: float
    events: tuple[Event, ...]


# The positional encoding's fields, in the order the event classes declared them.
_STORED_FIELDS = (
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
    "extra_keys",
    "group_idx",
)
_REMOVED_FIELDS = ("block_hashes", "medium", "group_idx")
_DECODER = msgspec.msgpack.Decoder()


def seq_of(raw: bytes) -> int:
    """A frame's sequence number (8 bytes, big-endian; -1 ends a replay)."""
    if len(raw) != 8:
        raise WireError(f"a sequence number is 8 bytes, not {len(raw)}")
    return int.from_bytes(raw, "big", signed=True)


def read_frame(frames: Sequence[bytes]) -> Batch:
    """One published message `[topic, seq, payload]`."""
    if len(frames) != 3:
        raise WireError(f"a KV event message has 3 frames (topic, seq, payload), not {len(frames)}")
    return read_batch(seq_of(frames[1]), frames[2])


def read_batch(seq: int, payload: bytes) -> Batch:
    try:
        batch = _DECODER.decode(payload)
    except msgspec.DecodeError as exc:
        raise WireError(f"the payload is not msgpack: {exc}") from exc
    if not isinstance(batch, list) or len(batch) < 2 or not isinstance(batch[1], list):
        raise WireError("an event batch is an array [ts, events, ...]")
    ts = batch[0]
    if not isinstance(ts, int | float) or isinstance(ts, bool):
        raise WireError(f"an event batch's ts is a number, not {ts!r}")
    return Batch(seq, float(ts), tuple(read_event(e) for e in batch[1]))


def read_event(raw: Any) -> Event:
    """One event, in either encoding."""
    if isinstance(raw, dict):
        kind, fields = raw.get("type"), raw
    elif isinstance(raw, list) and raw:
        kind = raw[0]
        names = _STORED_FIELDS if kind == "BlockStored" else _REMOVED_FIELDS
        fields = dict(zip(names, raw[1:], strict=False))
    else:
        raise WireError(f"an event is a map or an array, not {type(raw).__name__}")
    if kind == "BlockStored":
        return _stored(fields)
    if kind == "BlockRemoved":
        return Removed(_hashes(fields), _group(fields))
    if kind == "AllBlocksCleared":
        return Cleared()
    raise WireError(f"unknown event type {kind!r}")


def _stored(fields: dict[str, Any]) -> Stored:
    hashes = _hashes(fields)
    parent = fields.get("parent_block_hash")
    if parent is not None and not _is_hash(parent):
        raise WireError(f"parent_block_hash is bytes, an integer or null, not {parent!r}")
    tokens = fields.get("token_ids")
    if not isinstance(tokens, list) or not _ids(tokens):
        raise WireError("BlockStored.token_ids is an array of 32-bit integers")
    size = fields.get("block_size")
    if not _is_int(size) or size <= 0:
        raise WireError(f"BlockStored.block_size is a positive integer, not {size!r}")
    if len(tokens) != len(hashes) * size:
        raise WireError(
            f"BlockStored has {len(tokens)} token ids for {len(hashes)} blocks of {size}"
        )
    # vLLM sends `extra_keys` as one entry per block, None where a block's hash took nothing
    # beyond its tokens (vLLM 0.32: [None, None, ...] for every plain prompt).
    extra_keys = fields.get("extra_keys") or ()
    extra = bool(fields.get("lora_name") or fields.get("lora_id")) or any(
        k is not None for k in extra_keys
    )
    return Stored(hashes, parent, tuple(tokens), size, extra, _group(fields))


def _hashes(fields: dict[str, Any]) -> tuple[EngineHash, ...]:
    hashes = fields.get("block_hashes")
    if not isinstance(hashes, list) or not all(_is_hash(h) for h in hashes):
        raise WireError("block_hashes is an array of bytes or integers")
    return tuple(hashes)


def _group(fields: dict[str, Any]) -> int:
    group = fields.get("group_idx")
    if group is None:
        return 0
    if not _is_int(group) or group < 0:
        raise WireError(f"group_idx is a non-negative integer, not {group!r}")
    return int(group)


def _ids(tokens: list[Any]) -> bool:
    """Whether every item is a token id: a 32-bit integer, checked in C as the keys pack
    them (a msgpack true or false passes as 1 or 0: a garbled id, no worse than any other)."""
    try:
        array("i", tokens)
    except (TypeError, OverflowError):
        return False
    return True


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_hash(value: Any) -> TypeGuard[EngineHash]:
    return isinstance(value, bytes) or _is_int(value)
