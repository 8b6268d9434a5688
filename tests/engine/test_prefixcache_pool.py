"""The prefix cache's block pool (engine/prefixcache/pool.py) and its block hashes: examples of
each rule, then a state machine that drives the pool at random and checks its invariants and
the events a subscriber would read after every step."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from engine.prefixcache import (
    NONE_HASH,
    AllBlocksCleared,
    BlockCopy,
    BlockHash,
    BlockRemoved,
    BlockStored,
    CacheEvent,
    KVBlockPool,
    OutOfBlocks,
    UnknownSequence,
    block_hashes,
    external,
    hash_block,
)

BS = 4  # a small block size keeps the examples short


def make(num_blocks: int = 16, block_size: int = BS) -> tuple[KVBlockPool, list[CacheEvent]]:
    events: list[CacheEvent] = []
    return KVBlockPool(num_blocks, block_size, on_event=events.append), events


def run(pool: KVBlockPool, seq: int, prompt: list[int], output: list[int]) -> None:
    """A sequence's life until it ends: its prompt computed, then each output token appended."""
    pool.allocate(seq, prompt)
    for token in output:
        pool.append(seq, token)
    pool.free(seq)


# --- hashes ------------------------------------------------------------------------------

# vLLM 0.32's hash_block_tokens(sha256, ...) after init_none_hash(sha256), PYTHONHASHSEED unset,
# for the token ids 0..15 and 16..31 (.venv-vllm; test_prefixcache_events.py checks it live).
VLLM_0_15 = "fe8fa5dda3210d0ca2031e37cbe3b001186773cd1c710beb2d45fcb51d434798"
VLLM_16_31 = "8be7aaa33831156d316f1f463ae57e643deb63f42e633e2d631df88815cc4629"


def test_block_hashes_chain_as_vllms_default_sha256() -> None:
    first, second = block_hashes(list(range(33)), 16)  # the partial third block has none
    assert (first.hex(), second.hex()) == (VLLM_0_15, VLLM_16_31)
    assert first == hash_block(None, range(16)) == hash_block(NONE_HASH, range(16))
    assert second == hash_block(first, range(16, 32))
    assert external(second) == int(VLLM_16_31, 16) & (2**64 - 1)


def test_block_hashes_are_the_same_in_every_process() -> None:
    """No `hash()` of a str anywhere: another PYTHONHASHSEED gives the same hashes."""
    code = (
        "from engine.prefixcache import block_hashes; print(block_hashes(range(40), 16)[-1].hex())"
    )
    seen = {
        subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout.strip()
        for seed in ("0", "12345")
    }
    assert seen == {VLLM_16_31}


def test_a_block_hash_depends_on_its_parent() -> None:
    a = block_hashes([1, 2, 3, 4, 9, 9, 9, 9], BS)
    b = block_hashes([5, 6, 7, 8, 9, 9, 9, 9], BS)
    assert a[1] != b[1]
    assert hash_block(None, [1, 2, 3, 4]) == hash_block(None, (1, 2, 3, 4))


# --- prefix hits -------------------------------------------------------------------------


def test_a_prompt_reuses_the_longest_cached_prefix_of_full_blocks() -> None:
    pool, _ = make()
    prompt = list(range(10))  # blocks [0..3] [4..7], and 2 tokens
    first = pool.allocate(1, prompt)
    assert first.cached_tokens == 0 and len(first.table) == 3
    pool.computed(1, 10)
    second = pool.allocate(2, [*prompt[:8], 50, 51, 52])
    assert second.cached_tokens == 8
    assert second.table[:2] == first.table[:2] and second.table[2] not in first.table
    assert [pool.refcount(b) for b in first.table] == [2, 2, 1]
    assert pool.stats.queries == 10 + 11 and pool.stats.hits == 8
    assert pool.stats.requests == 2


def test_the_last_prompt_token_is_always_computed() -> None:
    """A prompt whose every block is cached still computes its last block (vLLM: the hit is
    capped at num_tokens - 1, whole blocks)."""
    pool, _ = make()
    pool.allocate(1, list(range(8)))
    pool.computed(1, 8)
    again = pool.allocate(2, list(range(8)))
    assert again.cached_tokens == 4
    assert pool.allocate(3, list(range(9))).cached_tokens == 8


def test_only_computed_blocks_are_hit() -> None:
    """Blocks allocated but not yet written are no prefix for anyone."""
    pool, events = make()
    pool.allocate(1, list(range(9)))
    assert pool.allocate(2, list(range(9))).cached_tokens == 0
    pool.computed(1, 5)  # one block written, the next one partly
    assert pool.allocate(3, list(range(9))).cached_tokens == 4
    assert events == [BlockStored(tuple(block_hashes(range(4), BS)), None, (0, 1, 2, 3), BS)]


def test_decoded_blocks_are_cached_once_fed() -> None:
    """A block filled by generated tokens is cached once its last token has been fed (the
    next token appended), so a follow-up turn whose prompt is the whole exchange reuses it."""
    pool, events = make()
    prompt, output = [1, 2, 3], [4, 5, 6, 7, 8]
    run(pool, 1, prompt, output)
    history = prompt + output  # 8 tokens: blocks [1..4] [5..8]; 8 was never fed
    assert pool.allocate(2, [*history, 9]).cached_tokens == 4
    hashes = block_hashes(history, BS)
    assert events == [BlockStored((hashes[0],), None, (1, 2, 3, 4), BS)]


def test_a_second_copy_of_a_block_is_not_announced_again() -> None:
    """Two sequences that compute the same prompt at once both fill a block of one hash: the
    hash is announced once and withdrawn only when no block of it is left."""
    pool, events = make(num_blocks=4)
    pool.allocate(1, [1, 2, 3, 4, 5])
    pool.allocate(2, [1, 2, 3, 4, 6])
    pool.computed(1, 5)
    pool.computed(2, 5)
    stored = [e for e in events if isinstance(e, BlockStored)]
    assert len(stored) == 1 and pool.num_cached_blocks == 2
    pool.free(1)  # its copy is not needed: 2 keeps the hash
    assert pool.num_cached_blocks == 1 and pool.eviction_order() == ()
    pool.free(2)
    assert len(pool.eviction_order()) == 1
    pool.allocate(3, list(range(100, 116)))  # all four blocks: the cached one is evicted
    assert events[-1] == BlockRemoved((stored[0].block_hashes[0],))


def test_a_new_copy_replaces_an_evictable_one() -> None:
    """A prompt of one whole cached block recomputes it (its last token must be) into a new
    block: the evictable old copy goes blank, and the hash, held all along, is not
    announced or withdrawn."""
    pool, events = make(num_blocks=3)
    pool.allocate(1, [1, 2, 3, 4])
    pool.computed(1, 4)
    (old,) = pool.table(1)
    pool.free(1)
    events.clear()
    assert pool.allocate(2, [1, 2, 3, 4]).cached_tokens == 0
    pool.append(2, 5)
    (new, _) = pool.table(2)
    assert events == [] and pool.cached_hash(old) is None
    assert pool.cached_hash(new) == block_hashes([1, 2, 3, 4], BS)[0]
    assert pool.eviction_order() == ()


# --- forks -------------------------------------------------------------------------------


def test_a_fork_shares_full_blocks_and_copies_the_partial_one() -> None:
    pool, _ = make()
    parent = pool.allocate(1, list(range(6)))
    pool.computed(1, 6)
    copy = pool.fork(1, 2)
    child = pool.table(2)
    assert copy == BlockCopy(parent.table[1], child[1], 2)
    assert child[0] == parent.table[0] and child[1] != parent.table[1]
    assert pool.refcount(parent.table[0]) == 2 and pool.refcount(parent.table[1]) == 1
    pool.append(1, 10)
    pool.append(2, 20)  # each writes into its own last block
    assert pool.table(1) == parent.table and pool.table(2) == child


def test_a_fork_of_whole_blocks_copies_nothing() -> None:
    pool, _ = make()
    pool.allocate(1, list(range(8)))
    assert pool.fork(1, 2) is None
    assert pool.table(2) == pool.table(1)
    assert pool.append(2, 9) not in pool.table(1)  # a new block of its own


# --- eviction ----------------------------------------------------------------------------


def test_blank_blocks_go_first_then_cached_ones_least_recently_released() -> None:
    pool, events = make(num_blocks=6)
    for seq, base in ((1, 100), (2, 200), (3, 300)):  # each: one full block and a partial
        pool.allocate(seq, list(range(base, base + 5)))
        pool.computed(seq, 5)
    for seq in (2, 1, 3):
        pool.free(seq)
    full = {
        seq: block_hashes(range(base, base + 4), BS)[0]
        for seq, base in ((1, 100), (2, 200), (3, 300))
    }
    events.clear()
    pool.allocate(4, list(range(12)))  # 3 blocks: the 3 blank partial blocks
    assert events == []
    pool.allocate(5, list(range(500, 508)))  # 2 more: the least recently released cached
    assert events == [BlockRemoved((full[2],)), BlockRemoved((full[1],))]
    pool.free(4)
    assert pool.allocate(6, list(range(300, 305))).cached_tokens == 4  # 3's is still cached


def test_a_hit_makes_a_block_recently_used() -> None:
    pool, _ = make(num_blocks=4)
    for seq, base in ((1, 100), (2, 200)):
        pool.allocate(seq, list(range(base, base + 4)))
        pool.append(seq, 0)  # its block fed: cached
    pool.free(1)
    pool.free(2)
    old = pool.eviction_order()
    pool.allocate(3, [*range(100, 104), 7])  # hits 1's block
    pool.free(3)
    assert pool.eviction_order()[-1] == old[0]  # now the most recently released


def test_a_sequences_tail_is_evicted_before_its_head() -> None:
    pool, _ = make(num_blocks=3)
    pool.allocate(1, list(range(12)))
    pool.computed(1, 12)
    head, middle, tail = pool.table(1)
    pool.free(1)
    assert pool.eviction_order() == (tail, middle, head)


# --- out of blocks -----------------------------------------------------------------------


def test_out_of_blocks_refuses_and_changes_nothing() -> None:
    pool, events = make(num_blocks=3)
    pool.allocate(1, list(range(9)))  # all three blocks
    before = (pool.table(1), pool.num_free_blocks, pool.stats)
    assert not pool.can_allocate([1])
    with pytest.raises(OutOfBlocks) as refused:
        pool.allocate(2, [1])
    assert (refused.value.needed, refused.value.available) == (1, 0)
    assert 2 not in pool and (pool.table(1), pool.num_free_blocks, pool.stats) == before
    for token in range(3):
        pool.append(1, token)  # fills the last block
    assert pool.blocks_to_append(1) == 1
    events.clear()
    with pytest.raises(OutOfBlocks):
        pool.append(1, 99)
    assert pool.num_tokens(1) == 12 and events == []  # not even its fed block was cached
    pool.free(1)
    assert pool.can_allocate(list(range(12)))


def test_hitting_evictable_blocks_counts_them_as_taken() -> None:
    """A prefix hit on an evictable block takes it out of the free pool too."""
    pool, _ = make(num_blocks=2)
    pool.allocate(1, list(range(5)))
    pool.computed(1, 5)
    pool.free(1)  # one cached (evictable) block, one blank
    assert pool.num_free_blocks == 2
    assert pool.can_allocate(list(range(5)))  # its hit and one new block
    assert not pool.can_allocate(list(range(9)))  # its hit and two new blocks
    assert pool.allocate(2, list(range(5))).cached_tokens == 4
    assert pool.num_free_blocks == 0


def test_unknown_sequences_are_refused() -> None:
    pool, _ = make()
    with pytest.raises(UnknownSequence):
        pool.free(1)
    with pytest.raises(UnknownSequence):
        pool.append(1, 1)
    with pytest.raises(ValueError, match="num_blocks"):
        KVBlockPool(0)


# --- reset, counters -----------------------------------------------------------------------


def test_reset_clears_the_cache_only_when_no_sequence_holds_blocks() -> None:
    pool, events = make()
    pool.allocate(1, list(range(5)))
    pool.computed(1, 5)
    assert not pool.reset()
    pool.free(1)
    assert pool.reset()
    assert events[-1] == AllBlocksCleared() and pool.num_cached_blocks == 0
    assert pool.allocate(2, list(range(5))).cached_tokens == 0
    assert pool.num_free_blocks == 16 - 2


def test_a_preempted_sequence_is_counted_apart() -> None:
    pool, _ = make()
    pool.allocate(1, list(range(9)))
    pool.computed(1, 9)
    pool.free(1)
    pool.allocate(1, list(range(9)), preempted=True)  # recomputed after preemption
    stats = pool.stats
    assert (stats.requests, stats.queries, stats.hits) == (1, 9, 0)
    assert (stats.preempted_requests, stats.preempted_queries, stats.preempted_hits) == (1, 9, 8)


# --- at random ---------------------------------------------------------------------------


HEADS = [[], [0, 1, 2, 0], [0, 1, 2, 0, 1, 1, 1, 1], [2, 2, 2, 2, 0]]  # shared prefixes


class PoolMachine(RuleBasedStateMachine):
    """Sequences admitted, fed, grown, forked and freed at random, from a tiny vocabulary so
    that prompts share prefixes. After every step: the pool's state against a model of the
    tables, and its events against a subscriber's view of what the cache holds."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[CacheEvent] = []
        self.pool = KVBlockPool(12, BS, on_event=self.events.append)
        self.tokens: dict[int, list[int]] = {}  # the model: each live sequence's tokens
        self.next_id = 0
        self.announced: set[BlockHash] = set()  # as a subscriber knows it
        self.read = 0  # events applied to `announced`

    def _new_id(self) -> int:
        self.next_id += 1
        return self.next_id

    @rule(
        head=st.sampled_from(HEADS),
        tail=st.lists(st.integers(0, 2), max_size=9),
        preempted=st.booleans(),
        fed=st.integers(0, 14),
    )
    def allocate(self, head: list[int], tail: list[int], preempted: bool, fed: int) -> None:
        """Admitted, and `fed` tokens computed (a first prefill chunk, or none yet)."""
        prompt = head + tail or [0]
        seq = self._new_id()
        before = self.pool.stats
        fits = self.pool.can_allocate(prompt)
        try:
            got = self.pool.allocate(seq, prompt, preempted=preempted)
        except OutOfBlocks:
            assert not fits and seq not in self.pool and self.pool.stats == before
            return
        assert fits
        event("a prefix hit" if got.cached_tokens else "a miss")
        self.tokens[seq] = list(prompt)
        self.pool.computed(seq, fed)
        assert got.cached_tokens % BS == 0 and got.cached_tokens < len(prompt)
        assert len(got.table) == -(-len(prompt) // BS)

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def computed(self, data: st.DataObject) -> None:
        seq = data.draw(st.sampled_from(sorted(self.tokens)))
        self.pool.computed(seq, data.draw(st.integers(0, len(self.tokens[seq]))))

    @precondition(lambda self: self.tokens)
    @rule(data=st.data(), tokens=st.lists(st.integers(0, 2), min_size=1, max_size=6))
    def append(self, data: st.DataObject, tokens: list[int]) -> None:
        """Decode steps: a token sampled and appended at a time."""
        seq = data.draw(st.sampled_from(sorted(self.tokens)))
        for token in tokens:
            needed = self.pool.blocks_to_append(seq)
            try:
                self.pool.append(seq, token)
            except OutOfBlocks:
                assert needed > self.pool.num_free_blocks
                return
            self.tokens[seq].append(token)

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def fork(self, data: st.DataObject) -> None:
        parent = data.draw(st.sampled_from(sorted(self.tokens)))
        child = self._new_id()
        try:
            copy = self.pool.fork(parent, child)
        except OutOfBlocks:
            assert len(self.tokens[parent]) % BS and self.pool.num_free_blocks == 0
            return
        self.tokens[child] = list(self.tokens[parent])
        assert (copy is None) == (len(self.tokens[parent]) % BS == 0)

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        seq = data.draw(st.sampled_from(sorted(self.tokens)))
        self.pool.free(seq)
        del self.tokens[seq]

    @rule(now=st.integers(0, 9))
    def reset(self, now: int) -> None:
        if now == 0:  # rarely, or the cache would be empty most of the time
            assert self.pool.reset() == (not self.tokens)

    @invariant()
    def refcounts_count_the_tables(self) -> None:
        counts = [0] * self.pool.num_blocks
        for seq in self.tokens:
            for block in self.pool.table(seq):
                counts[block] += 1
        assert [self.pool.refcount(b) for b in range(self.pool.num_blocks)] == counts
        assert self.pool.num_free_blocks == counts.count(0)

    @invariant()
    def tables_cover_their_tokens_and_share_only_full_blocks(self) -> None:
        where: dict[int, set[tuple[int, ...]]] = {}  # block -> the tokens it holds, per table
        for seq, tokens in self.tokens.items():
            table = self.pool.table(seq)
            assert len(table) == -(-len(tokens) // BS)
            assert len(set(table)) == len(table)
            for i, block in enumerate(table):
                where.setdefault(block, set()).add(tuple(tokens[: (i + 1) * BS]))
        for block, prefixes in where.items():
            if self.pool.refcount(block) > 1:  # shared: a full block, after one prefix
                assert len(prefixes) == 1
                (prefix,) = prefixes
                assert prefix and len(prefix) % BS == 0

    @invariant()
    def a_cached_block_holds_the_tokens_of_its_hash(self) -> None:
        for seq, tokens in self.tokens.items():
            hashes = block_hashes(tokens, BS)
            for i, block in enumerate(self.pool.table(seq)):
                cached = self.pool.cached_hash(block)
                assert cached is None or cached == hashes[i]

    @invariant()
    def events_say_what_the_cache_holds(self) -> None:
        for e in self.events[self.read :]:
            event(type(e).__name__)
            if isinstance(e, BlockStored):
                assert e.parent is None or e.parent in self.announced
                assert not set(e.block_hashes) & self.announced
                assert tuple(block_hashes(e.token_ids, e.block_size, e.parent)) == e.block_hashes
                self.announced |= set(e.block_hashes)
            elif isinstance(e, BlockRemoved):
                assert set(e.block_hashes) <= self.announced
                self.announced -= set(e.block_hashes)
            else:
                self.announced.clear()
        self.read = len(self.events)
        held = {self.pool.cached_hash(b) for b in range(self.pool.num_blocks)} - {None}
        assert held == self.announced

    @invariant()
    def evictable_blocks_are_sole_copies(self) -> None:
        for block in self.pool.eviction_order():
            assert self.pool.refcount(block) == 0
            h = self.pool.cached_hash(block)
            assert h is not None
            assert [b for b in range(self.pool.num_blocks) if self.pool.cached_hash(b) == h] == [
                block
            ]

    @invariant()
    def hits_never_exceed_queries(self) -> None:
        stats = self.pool.stats
        assert 0 <= stats.hits <= stats.queries
        assert 0 <= stats.preempted_hits <= stats.preempted_queries


PoolMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)
TestPoolAtRandom = PoolMachine.TestCase
