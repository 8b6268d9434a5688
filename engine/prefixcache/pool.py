"""Paged KV blocks with prefix reuse: which physical block holds which positions of which
sequence, and which blocks a new prompt can take from the cache instead of computing.

Pure and synchronous bookkeeping (no torch, no I/O), as vLLM's KVCacheManager and BlockPool
(v1/core/kv_cache_manager.py, block_pool.py) with one KV cache group. Each sequence has a
block table: position p of the sequence lives in block `table[p // block_size]`, at offset
`p % block_size`. A full block whose KV has been computed is cached under its chained hash
(hashing.py); a prompt reuses the blocks of its longest cached prefix of full blocks and its
prefill starts after them.

How a scheduler drives it (every call either succeeds or raises and changes nothing):
- `allocate(seq, prompt)` on admission (a preempted sequence: prompt plus its output so far,
  `preempted=True`): blocks for every prompt token, the cached prefix shared. It returns how
  many leading tokens are cached (a multiple of `block_size`, and at least the last prompt
  token is left to compute, for its logits) and the table. `OutOfBlocks`: leave the request
  waiting; `can_allocate` asks first without raising.
- `computed(seq, n)` once the KV of positions 0..n has been written (a prompt chunk fed for
  its KV alone): the full blocks below n become cached.
- `append(seq, token)` for each sampled token: everything before it has been through the model
  (the token came from the logits of the last one), so its full blocks become cached, decoded
  ones too; the token is added, with a new block when the last one is full
  (`blocks_to_append`). `OutOfBlocks`: preempt a sequence (`free` it) and append again.
- `fork(parent, child)` for a request's other choices once the parent's prompt is computed:
  the child shares the parent's full blocks; a partial last block is copied (`BlockCopy`,
  for the model runner after the forward), since both will write into it.
- `free(seq)` when a sequence ends or is preempted. Its blocks stay cached, evictable, until a
  new block is needed; the least recently released is evicted first.

Invariants (tests/engine/test_prefixcache_pool.py): a block's refcount is the number of
tables holding it; a block in two tables is full (shared by a prefix hit or a fork) and never
written again, so a sequence's last, partial block is its own; a hash is announced
(`BlockStored`) when the first block of it is cached and withdrawn (`BlockRemoved`) when the
last is evicted, and a hash with two blocks has no evictable one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from engine.prefixcache.errors import DuplicateSequence, OutOfBlocks, UnknownSequence
from engine.prefixcache.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    CacheEvent,
    EventSink,
)
from engine.prefixcache.freelist import FreeBlocks
from engine.prefixcache.hashing import BlockHash, block_hashes, hash_block
from engine.prefixcache.stats import PrefixCacheStats

DEFAULT_BLOCK_SIZE = 16  # vLLM's default


def blocks_for(num_tokens: int, block_size: int) -> int:
    """Blocks that hold `num_tokens` positions (the last one perhaps partly)."""
    return -(-num_tokens // block_size)


@dataclass(frozen=True, slots=True)
class Allocation:
    cached_tokens: int  # leading prompt tokens already in the cache: prefill starts here
    table: tuple[int, ...]


class TableEdit(NamedTuple):
    """Slot `slot`'s block table from index `first` on is `blocks`: how a scheduler tells the
    model runners (every rank) where a sequence's positions live. Ints only, for the step
    message."""

    slot: int
    first: int
    blocks: tuple[int, ...]


class BlockCopy(NamedTuple):
    """After the forward, copy positions 0..length of block `src` into block `dst`, every
    layer, keys and values. A tuple of ints, so it travels in a step message as it is."""

    src: int
    dst: int
    length: int


@dataclass(slots=True)
class _Seq:
    tokens: list[int]
    table: list[int]
    hashes: list[BlockHash]  # of each full block of `tokens`
    computed: int  # leading tokens whose KV is written
    registered: int  # leading blocks cached under their hash


class KVBlockPool:
    def __init__(
        self,
        num_blocks: int,
        block_size: int = DEFAULT_BLOCK_SIZE,
        *,
        on_event: EventSink | None = None,
        caching: bool = True,
    ) -> None:
        """`on_event` hears every cache event, in order, on the caller's thread (the engine
        collects a step's and publishes them as one batch). `caching=False` pages without
        reuse (vLLM's `--no-enable-prefix-caching`): no hits, no hashes, no events."""
        for name, value in (("num_blocks", num_blocks), ("block_size", block_size)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}: must be an integer >= 1, got {value!r}")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.caching = caching
        self._on_event = on_event
        self._refs = [0] * num_blocks
        self._hash: list[BlockHash | None] = [None] * num_blocks
        self._holders: dict[BlockHash, list[int]] = {}  # hash -> the cached blocks of it
        self._free = FreeBlocks(num_blocks)
        self._seqs: dict[int, _Seq] = {}
        self._stats = PrefixCacheStats()

    # --- reading -------------------------------------------------------------------------

    @property
    def stats(self) -> PrefixCacheStats:
        return self._stats

    @property
    def num_free_blocks(self) -> int:
        """Blocks a new sequence can take: blank ones and evictable cached ones."""
        return len(self._free)

    @property
    def num_cached_blocks(self) -> int:
        return sum(len(blocks) for blocks in self._holders.values())

    @property
    def usage(self) -> float:
        """The share of blocks some sequence holds (vLLM's kv_cache_usage_perc)."""
        return 1.0 - len(self._free) / self.num_blocks

    def __contains__(self, seq_id: int) -> bool:
        return seq_id in self._seqs

    def table(self, seq_id: int, start: int = 0) -> tuple[int, ...]:
        """The sequence's block table, from entry `start` on."""
        return tuple(self._seq(seq_id).table[start:])

    def table_len(self, seq_id: int) -> int:
        return len(self._seq(seq_id).table)

    def num_tokens(self, seq_id: int) -> int:
        return len(self._seq(seq_id).tokens)

    def refcount(self, block: int) -> int:
        return self._refs[block]

    def cached_hash(self, block: int) -> BlockHash | None:
        return self._hash[block]

    def eviction_order(self) -> tuple[int, ...]:
        """The evictable cached blocks, the next one evicted first."""
        return self._free.eviction_order()

    # --- admission -----------------------------------------------------------------------

    def can_allocate(self, token_ids: Sequence[int]) -> bool:
        hashes = block_hashes(token_ids, self.block_size)
        return self._cost(token_ids, self._hits(hashes, len(token_ids))) <= len(self._free)

    def allocate(
        self, seq_id: int, token_ids: Sequence[int], *, preempted: bool = False
    ) -> Allocation:
        if seq_id in self._seqs:
            raise DuplicateSequence(seq_id)
        if not token_ids:
            raise ValueError(f"sequence {seq_id}: token_ids is empty")
        tokens = [int(t) for t in token_ids]
        hashes = block_hashes(tokens, self.block_size) if self.caching else []
        hits = self._hits(hashes, len(tokens))
        cost = self._cost(tokens, hits)
        if cost > len(self._free):
            raise OutOfBlocks(seq_id, cost, len(self._free))
        for block in hits:
            self._claim(block)
        fresh = blocks_for(len(tokens), self.block_size) - len(hits)
        table = hits + [self._take() for _ in range(fresh)]
        cached = len(hits) * self.block_size
        self._seqs[seq_id] = _Seq(tokens, table, hashes, cached, len(hits))
        self._stats = self._stats.record(len(tokens), cached, preempted)
        return Allocation(cached, tuple(table))

    def _hits(self, hashes: list[BlockHash], num_tokens: int) -> list[int]:
        """The cached blocks of the longest cached prefix, leaving the last token to compute."""
        hits: list[int] = []
        if not self.caching:
            return hits
        for h in hashes[: (num_tokens - 1) // self.block_size]:
            holders = self._holders.get(h)
            if not holders:
                break
            hits.append(next((b for b in holders if self._refs[b]), holders[0]))
        return hits

    def _cost(self, tokens: Sequence[int], hits: list[int]) -> int:
        """Free blocks an allocation takes: its new ones, and the evictable ones it hits."""
        fresh = blocks_for(len(tokens), self.block_size) - len(hits)
        return fresh + sum(1 for b in hits if self._refs[b] == 0)

    # --- growth --------------------------------------------------------------------------

    def computed(self, seq_id: int, num_tokens: int) -> None:
        """The KV of positions 0..num_tokens is written: their full blocks become cached."""
        seq = self._seq(seq_id)
        seq.computed = max(seq.computed, min(num_tokens, len(seq.tokens)))
        self._register(seq)

    def blocks_to_append(self, seq_id: int) -> int:
        """Free blocks the next `append` takes: 1 when the last block is full, else 0."""
        seq = self._seq(seq_id)
        return int(len(seq.tokens) == len(seq.table) * self.block_size)

    def append(self, seq_id: int, token_id: int) -> int | None:
        """A sampled token joins the sequence; every token before it has been computed.
        Returns the block added to the table for it, if its last one was full."""
        seq = self._seq(seq_id)
        grow = len(seq.tokens) == len(seq.table) * self.block_size
        if grow and not self._free:
            raise OutOfBlocks(seq_id, 1, 0)
        seq.computed = len(seq.tokens)
        self._register(seq)
        block = self._take() if grow else None
        if block is not None:
            seq.table.append(block)
        seq.tokens.append(int(token_id))
        if self.caching and len(seq.tokens) % self.block_size == 0:
            parent = seq.hashes[-1] if seq.hashes else None
            seq.hashes.append(hash_block(parent, seq.tokens[-self.block_size :]))
        return block

    def fork(self, parent_id: int, child_id: int) -> BlockCopy | None:
        """`child_id` starts as a copy of `parent_id`: its full blocks shared, its partial last
        block copied (the returned copy, for the model runner; None when there is none)."""
        parent = self._seq(parent_id)
        if child_id in self._seqs:
            raise DuplicateSequence(child_id)
        full, partial = divmod(len(parent.tokens), self.block_size)
        if partial and not self._free:
            raise OutOfBlocks(child_id, 1, 0)
        table = parent.table[:full]
        for block in table:
            self._refs[block] += 1
        copy = None
        if partial:
            copy = BlockCopy(parent.table[full], self._take(), partial)
            table.append(copy.dst)
        self._seqs[child_id] = _Seq(
            list(parent.tokens), table, list(parent.hashes), parent.computed, parent.registered
        )
        return copy

    def free(self, seq_id: int) -> None:
        """The sequence ended or was preempted. Its blocks are released last one first, so a
        sequence's tail is evicted before its head (which other prompts share more often)."""
        seq = self._seqs.pop(seq_id, None)
        if seq is None:
            raise UnknownSequence(seq_id)
        for block in reversed(seq.table):
            self._refs[block] -= 1
            if self._refs[block] == 0:
                self._release(block)

    def reset(self) -> bool:
        """Forget every cached block (new weights: no KV computed before is valid). Only with
        no sequence holding blocks, as vLLM's `reset_prefix_cache`; False otherwise."""
        if self._seqs:
            return False
        self._free.blank_all()
        self._holders.clear()
        self._hash = [None] * self.num_blocks
        self._emit(AllBlocksCleared())
        return True

    # --- the cache -----------------------------------------------------------------------

    def _seq(self, seq_id: int) -> _Seq:
        seq = self._seqs.get(seq_id)
        if seq is None:
            raise UnknownSequence(seq_id)
        return seq

    def _register(self, seq: _Seq) -> None:
        """Cache the sequence's computed full blocks not cached yet, announcing each run of
        hashes the cache did not hold (a block whose hash another block holds is a second
        copy: cached, not announced again)."""
        if not self.caching:
            return
        full = seq.computed // self.block_size
        run: list[int] = []
        for i in range(seq.registered, full):
            block, h = seq.table[i], seq.hashes[i]
            if self._hash[block] is None:
                self._hash[block] = h
                holders = self._holders.setdefault(h, [])
                new = not holders
                for old in [b for b in holders if self._refs[b] == 0]:
                    self._forget(old)  # an evictable copy: this one replaces it
                holders.append(block)
                if new:
                    run.append(i)
                    continue
            assert self._hash[block] == h, "a shared block holds other tokens"
            self._announce(seq, run)
            run = []
        self._announce(seq, run)
        seq.registered = max(seq.registered, full)

    def _announce(self, seq: _Seq, run: list[int]) -> None:
        if not run:
            return
        first, end, size = run[0], run[-1] + 1, self.block_size
        parent = seq.hashes[first - 1] if first else None
        tokens = tuple(seq.tokens[first * size : end * size])
        self._emit(BlockStored(tuple(seq.hashes[first:end]), parent, tokens, size))

    def _claim(self, block: int) -> None:
        if self._refs[block] == 0:
            self._free.claim(block)
        self._refs[block] += 1

    def _take(self) -> int:
        block, cached = self._free.take()
        if cached:  # the sole block of its hash: the hash leaves the cache
            h = self._hash[block]
            assert h is not None and self._holders[h] == [block]
            del self._holders[h]
            self._hash[block] = None
            self._emit(BlockRemoved((h,)))
        self._refs[block] = 1
        return block

    def _forget(self, block: int) -> None:
        """An evictable block's hash has another block: it becomes blank, unannounced."""
        h = self._hash[block]
        assert h is not None
        self._holders[h].remove(block)
        self._hash[block] = None
        self._free.claim(block)
        self._free.release_blank(block)

    def _release(self, block: int) -> None:
        h = self._hash[block]
        if h is None:
            self._free.release_blank(block)
            return
        holders = self._holders[h]
        if len(holders) > 1:  # another block keeps the hash: this copy is not needed
            holders.remove(block)
            self._hash[block] = None
            self._free.release_blank(block)
        else:
            self._free.release_cached(block)

    def _emit(self, event: CacheEvent) -> None:
        if self._on_event is not None:
            self._on_event(event)
