"""The KV cache's paged blocks with prefix reuse, and their events in vLLM's format.

Not engine/model/blocks.py (GGUF quantization blocks): these are blocks of token positions.
- hashing.py: a full block's hash, chained over its parent's and its token ids (vLLM's sha256).
- pool.py: the block pool (block tables, refcounts, prefix hits, LRU eviction, counters); pure.
- events.py: what the pool tells observers (BlockStored, BlockRemoved, AllBlocksCleared).
- wire.py and publisher.py: those events as vLLM's ZMQ publisher sends them (msgspec, pyzmq,
  imported only from there, so the pool runs without them).
"""

from engine.prefixcache.errors import DuplicateSequence, OutOfBlocks, PoolError, UnknownSequence
from engine.prefixcache.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    CacheEvent,
    EventSink,
)
from engine.prefixcache.hashing import NONE_HASH, BlockHash, block_hashes, external, hash_block
from engine.prefixcache.pool import (
    DEFAULT_BLOCK_SIZE,
    Allocation,
    BlockCopy,
    KVBlockPool,
    TableEdit,
    blocks_for,
)
from engine.prefixcache.stats import PrefixCacheStats

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "NONE_HASH",
    "AllBlocksCleared",
    "Allocation",
    "BlockCopy",
    "BlockHash",
    "BlockRemoved",
    "BlockStored",
    "CacheEvent",
    "DuplicateSequence",
    "EventSink",
    "KVBlockPool",
    "OutOfBlocks",
    "PoolError",
    "PrefixCacheStats",
    "TableEdit",
    "UnknownSequence",
    "block_hashes",
    "blocks_for",
    "external",
    "hash_block",
]
