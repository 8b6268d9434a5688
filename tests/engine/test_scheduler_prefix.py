"""The scheduler over the prefix cache's pool: cached prefixes skip their prefill, the runners
hear every table change once, children share their parent's prompt blocks."""

from __future__ import annotations

import pytest

from engine.prefixcache import BlockStored, CacheEvent
from engine.scheduler import (
    BlockCopy,
    InvalidConfig,
    SamplingParams,
    Scheduler,
    SchedulerConfig,
    TableEdit,
)
from tests.engine.scheduler_support import letters, make, rows, step

PROMPT = list(range(40))  # two full blocks of 16 and 8 tokens more


def run_to_end(sched: Scheduler, token: int = 7) -> None:
    for _ in range(100):
        if not sched.has_work:
            return
        step(sched, token)
    raise AssertionError("the scheduler did not finish its work")


def test_a_second_request_with_the_same_prompt_prefills_after_its_cached_blocks() -> None:
    sched = make(max_num_batched_tokens=64)
    first = sched.add(0, PROMPT, SamplingParams(max_tokens=2))
    assert rows(step(sched, 7)) == [(0, 0, 40, True)]
    assert first.num_cached_tokens == 0
    run_to_end(sched)
    again = sched.add(1, [*PROMPT[:35], 99, 98], SamplingParams(max_tokens=2))
    batch = step(sched, 7)
    assert rows(batch) == [(1, 32, 5, True)]  # the two full blocks came from the cache
    assert again.num_cached_tokens == 32
    stats = sched.prefix_stats
    assert (stats.requests, stats.queries, stats.hits) == (2, 77, 32)


def test_a_whole_cached_prompt_still_computes_its_last_token() -> None:
    sched = make(max_num_batched_tokens=64)
    sched.add(0, PROMPT[:32], SamplingParams(max_tokens=1))
    run_to_end(sched)
    seq = sched.add(1, PROMPT[:32], SamplingParams(max_tokens=1))
    assert rows(step(sched, 7)) == [(1, 16, 16, True)]  # the last block is computed again
    assert seq.num_cached_tokens == 16  # it holds the token whose logits give the first


def test_the_runners_hear_each_table_change_once() -> None:
    sched = make(max_num_batched_tokens=64)
    sched.add(0, PROMPT[:15], SamplingParams(max_tokens=5))
    first = step(sched, 7)
    assert first.tables == (TableEdit(0, 0, (0,)),)
    assert step(sched, 7).tables == ()  # position 15 is still in block 0
    grown = step(sched, 7)  # position 16 needs the next block
    assert [(e.slot, e.first, len(e.blocks)) for e in grown.tables] == [(0, 1, 1)]
    assert step(sched, 7).tables == ()


def test_children_share_the_parents_full_blocks_and_copy_its_partial_one() -> None:
    sched = make(max_num_batched_tokens=64)
    sched.add_group([1, 2], PROMPT[:20], SamplingParams(max_tokens=3))
    batch = step(sched, 7)
    parent, child = batch.tables
    assert parent == TableEdit(0, 0, (0, 1))
    assert child.slot == 1 and child.blocks[0] == 0  # the full block, shared
    assert batch.forks == (BlockCopy(1, child.blocks[1], 4),)


def test_a_preempted_sequence_takes_its_own_blocks_back() -> None:
    sched = make(max_num_batched_tokens=64, num_slots=1, max_seq_len=128)
    seq = sched.add(0, PROMPT, SamplingParams(max_tokens=10, priority=1))
    step(sched, 7)
    step(sched, 7)
    sched.preempt(0)
    batch = step(sched, 7)
    assert rows(batch) == [(0, 32, 10, True)]  # prompt + 2 outputs, the first 32 cached
    stats = sched.prefix_stats
    assert (stats.preempted_requests, stats.preempted_hits) == (1, 32)
    assert seq.num_cached_tokens == 0  # what the answer reports: its first admission


def test_without_prefix_caching_nothing_is_reused_or_announced() -> None:
    events: list[CacheEvent] = []
    config = SchedulerConfig(max_num_batched_tokens=64, prefix_caching=False)
    sched = Scheduler(config, frozenset(), letters, on_event=events.append)
    for seq_id in (0, 1):
        sched.add(seq_id, PROMPT, SamplingParams(max_tokens=2))
        assert rows(step(sched, 7))[0][1] == 0
        run_to_end(sched)
    assert events == [] and sched.prefix_stats.hits == 0


def test_the_cache_announces_what_it_stores() -> None:
    events: list[CacheEvent] = []
    config = SchedulerConfig(max_num_batched_tokens=64)
    sched = Scheduler(config, frozenset(), letters, on_event=events.append)
    sched.add(0, PROMPT, SamplingParams(max_tokens=1))
    run_to_end(sched)
    (stored,) = events
    assert isinstance(stored, BlockStored)
    assert (stored.token_ids, stored.block_size) == (tuple(PROMPT[:32]), 16)


def test_fewer_blocks_than_the_slots_need_is_a_config_error() -> None:
    with pytest.raises(InvalidConfig, match="num_blocks"):
        SchedulerConfig(num_slots=2, max_seq_len=64, num_blocks=7)
    assert SchedulerConfig(num_slots=2, max_seq_len=64, num_blocks=8).total_blocks == 8
