"""What the block pool tells its observers: the three KV cache events vLLM publishes.

Plain frozen values (no msgspec, no sockets), with the pool's own 32-byte hashes; wire.py
turns a batch of them into vLLM's msgpack frame. The pool keeps one promise, which is what a
subscriber's index needs: a hash is announced (BlockStored) when the cache first holds a
block of it and withdrawn (BlockRemoved) when the cache holds none any more, so a stored
block's parent is always one announced and not yet withdrawn.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from engine.prefixcache.hashing import BlockHash


@dataclass(frozen=True, slots=True)
class BlockStored:
    """Blocks now cached: `block_hashes[i]` holds `token_ids[i * block_size:][:block_size]`,
    the first one chained after `parent` (None: the first block of a sequence)."""

    block_hashes: tuple[BlockHash, ...]
    parent: BlockHash | None
    token_ids: tuple[int, ...]
    block_size: int


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    """Blocks evicted: the cache holds none of these hashes any more."""

    block_hashes: tuple[BlockHash, ...]


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    """Every cached block is gone (the pool was reset)."""


CacheEvent = BlockStored | BlockRemoved | AllBlocksCleared
EventSink = Callable[[CacheEvent], None]
