"""Chunked prefill: a prompt over the step's token budget is fed a chunk per step, beside the
running sequences' decodes; a token is drawn only from a prompt's last chunk."""

from __future__ import annotations

import math

from engine.scheduler import BlockCopy, SamplingParams, SequenceStatus, TableEdit
from tests.engine.scheduler_support import make, rows, step

PROMPT = list(range(10))


def test_a_long_prompt_moves_the_step_every_chunk_while_others_decode() -> None:
    """The stall rule watches the step count: a prompt up to max_seq_len must not hold it."""
    sched = make(max_num_batched_tokens=256, max_seq_len=2048)
    running = sched.add(0, [1], SamplingParams(max_tokens=100))
    step(sched, 5)
    long = sched.add(1, [2] * 2047, SamplingParams())
    steps = 0
    while not long.output_ids:
        batch = step(sched, 6)
        steps += 1
        assert batch.seqs[0].seq_id == 0 and len(batch.seqs[0].token_ids) == 1  # it decodes
        assert batch.num_tokens <= 256 + 1
    assert steps == math.ceil(2047 / 256)
    assert len(running.output_ids) == 1 + steps


def test_chunks_cover_the_prompt_once_in_order() -> None:
    sched = make(max_num_batched_tokens=4)
    sched.add(0, PROMPT, SamplingParams())
    fed = []
    for _ in range(3):
        (row,) = step(sched, 7).seqs
        fed.append((row.start_pos, row.token_ids, row.sampled))
    assert fed == [(0, (0, 1, 2, 3), False), (4, (4, 5, 6, 7), False), (8, (8, 9), True)]


def test_a_group_forks_only_after_its_parents_last_chunk() -> None:
    sched = make(max_num_batched_tokens=4)
    sched.add_group([1, 2, 3], PROMPT, SamplingParams())
    for start in (0, 4):
        batch = step(sched, 7)
        assert rows(batch) == [(1, start, 4, False)]  # the children wait, fed nothing
        assert (batch.forks, batch.shared, batch.sampled_ids) == ((), (), ())
    last = step(sched, 7)
    assert rows(last) == [(1, 8, 2, True)]
    assert last.forks == (BlockCopy(0, 1, 10), BlockCopy(0, 2, 10))
    assert (last.shared, last.sampled_ids, last.sample_rows) == (
        ((2, 0), (3, 0)),
        (1, 2, 3),
        (0,) * 3,
    )
    assert rows(sched.schedule()) == [(1, 10, 1, True), (2, 10, 1, True), (3, 10, 1, True)]


def test_a_last_chunk_of_one_token_still_forks() -> None:
    sched = make(max_num_batched_tokens=9)
    sched.add_group([1, 2], PROMPT, SamplingParams())
    assert rows(step(sched, 7)) == [(1, 0, 9, False)]
    last = step(sched, 7)
    assert rows(last) == [(1, 9, 1, True)]
    assert (last.forks, last.shared) == ((BlockCopy(0, 1, 10),), ((2, 0),))


def test_a_parent_gone_mid_prompt_hands_the_prompt_to_its_first_choice() -> None:
    sched = make(max_num_batched_tokens=4)
    choices = sched.add_group([1, 2, 3], PROMPT, SamplingParams())
    step(sched, 7)
    assert sched.abort(1)
    fed = [step(sched, 7) for _ in range(3)]
    assert [rows(batch) for batch in fed] == [
        [(2, 0, 4, False)],  # 2 prefills the prompt anew in its own slot
        [(2, 4, 4, False)],
        [(2, 8, 2, True)],
    ]
    assert fed[0].tables == (TableEdit(1, 0, (0,)),)  # the block the parent let go
    assert (fed[-1].forks, fed[-1].shared) == ((BlockCopy(0, 1, 10),), ((3, 0),))
    assert [c.output_ids for c in choices] == [[], [7], [7]]


def test_a_choice_gone_while_waiting_for_the_prompt_gets_no_fork() -> None:
    sched = make(max_num_batched_tokens=8)
    sched.add_group([1, 2, 3], PROMPT, SamplingParams())
    step(sched, 7)
    assert sched.abort(2)
    child = sched.preempt(3)
    assert child.status is SequenceStatus.WAITING
    last = step(sched, 7)
    assert (last.forks, last.shared) == ((), ())
    # 3 is recomputed alone, after 1's prompt is in
    assert rows(last) == [(1, 8, 2, True), (3, 0, 6, False)]


def test_a_sequence_preempted_mid_prompt_starts_it_over() -> None:
    sched = make(max_num_batched_tokens=4)
    seq = sched.add(0, PROMPT, SamplingParams())
    step(sched, 7)
    sched.preempt(0)
    assert (seq.num_computed, seq.num_preemptions) == (0, 1)
    assert rows(step(sched, 7)) == [(0, 0, 4, False)]


def test_prompts_share_the_budget_in_admission_order() -> None:
    sched = make(max_num_batched_tokens=8)
    sched.add(0, PROMPT, SamplingParams())
    sched.add(1, PROMPT, SamplingParams())
    assert rows(step(sched, 7)) == [(0, 0, 8, False)]
    assert rows(step(sched, 7)) == [(0, 8, 2, True), (1, 0, 6, False)]
    assert rows(step(sched, 7)) == [(0, 10, 1, True), (1, 6, 4, True)]
