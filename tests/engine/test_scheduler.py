"""Scheduler bookkeeping: admission, phases, finishing, abort and preemption. No torch."""

from __future__ import annotations

import pytest

from engine.scheduler import (
    DuplicateSequence,
    EmptyPrompt,
    FinishReason,
    PromptTooLong,
    SamplingParams,
    SequenceStatus,
    UnknownSequence,
)
from tests.engine.scheduler_support import EOS, make, rows, started, step


def test_admission_is_fifo_and_takes_lowest_slots() -> None:
    sched = make()
    for i in (7, 3, 5):
        sched.add(i, [1, 2, i], SamplingParams())
    batch = sched.schedule()
    assert batch.is_prefill
    assert batch.seq_ids == (7, 3, 5)
    assert [s.slot for s in batch.seqs] == [0, 1, 2]
    assert [s.token_ids for s in batch.seqs] == [(1, 2, 7), (1, 2, 3), (1, 2, 5)]
    assert all(s.start_pos == 0 for s in batch.seqs)
    assert batch.num_tokens == 9


def test_full_slots_leave_requests_waiting_until_one_frees() -> None:
    sched = make(num_slots=2)
    for i in range(3):
        sched.add(i, [1], SamplingParams(max_tokens=10))
    first = sched.schedule()
    assert first.seq_ids == (0, 1)
    assert (first.num_waiting, sched.num_waiting, sched.free_slots) == (1, 1, 0)
    sched.update({0: 4, 1: 4})
    assert sched.schedule().seq_ids == (0, 1)  # still full: decode, request 2 keeps waiting
    finished = sched.update({0: EOS, 1: 5})
    assert [s.seq_id for s in finished] == [0]
    admitted = sched.schedule()
    assert admitted.is_prefill
    assert admitted.seq_ids == (1, 2)  # 1 decodes beside 2's prompt
    assert admitted.seqs[1].slot == 0  # the slot sequence 0 gave back
    assert admitted.num_waiting == 0


def test_max_num_seqs_caps_running_even_with_free_slots() -> None:
    sched = make(max_num_seqs=2, num_slots=8)
    for i in range(3):
        sched.add(i, [1], SamplingParams())
    assert sched.schedule().seq_ids == (0, 1)
    assert (sched.num_running, sched.num_waiting, sched.free_slots) == (2, 1, 6)


def test_token_budget_chunks_the_head_of_the_line_and_never_skips_it() -> None:
    sched = make(max_num_batched_tokens=10)
    sched.add(0, [1] * 4, SamplingParams())
    sched.add(1, [1] * 8, SamplingParams())
    sched.add(2, [1], SamplingParams())  # would fit whole, but may not overtake request 1
    first = step(sched, 5)
    assert rows(first) == [(0, 0, 4, True), (1, 0, 6, False)]  # 1 gets the budget left
    assert first.num_waiting == 1
    # 0 decodes, 2 (one token) rides along, 1's last two prompt tokens: single tokens first
    assert rows(sched.schedule()) == [(0, 4, 1, True), (2, 0, 1, True), (1, 6, 2, True)]


def test_token_budget_fills_exactly_and_decodes_ride_along() -> None:
    sched = make(max_num_batched_tokens=8)
    for i in range(3):
        sched.add(i, [1] * 4, SamplingParams())
    assert step(sched, 5).seq_ids == (0, 1)
    batch = sched.schedule()
    assert (batch.seq_ids, batch.num_tokens) == ((0, 1, 2), 6)  # the decodes cost no budget


def test_a_prompt_over_the_budget_is_fed_a_chunk_per_step_between_decodes() -> None:
    sched = make(max_num_batched_tokens=8, max_seq_len=64)
    sched.add(0, [1] * 2, SamplingParams())
    big = sched.add(1, list(range(20)), SamplingParams())
    assert rows(step(sched, 5)) == [(0, 0, 2, True), (1, 0, 6, False)]
    second = step(sched, 5)
    assert rows(second) == [(0, 2, 1, True), (1, 6, 8, False)]
    assert second.seqs[1].token_ids == tuple(range(6, 14))
    assert big.output_ids == []  # no token from a chunk that is not the prompt's last
    assert rows(step(sched, 7)) == [(0, 3, 1, True), (1, 14, 6, True)]
    assert big.output_ids == [7]
    assert rows(sched.schedule()) == [(0, 4, 1, True), (1, 20, 1, True)]


def test_a_short_prompt_behind_a_long_one_starts_at_the_next_step() -> None:
    """While requests wait, a running prompt keeps at most half the budget."""
    sched = make(max_num_batched_tokens=8, max_seq_len=64)
    sched.add(0, list(range(20)), SamplingParams())
    assert rows(step(sched, 5)) == [(0, 0, 8, False)]
    sched.add(1, [1] * 2, SamplingParams())
    sched.add(2, [1] * 9, SamplingParams())
    assert rows(step(sched, 5)) == [(0, 8, 4, False), (1, 0, 2, True), (2, 0, 2, False)]
    # nobody waits any more: the running prompts share the whole budget in admission order
    assert rows(step(sched, 5)) == [(1, 2, 1, True), (0, 12, 8, True)]
    assert rows(sched.schedule()) == [(0, 20, 1, True), (1, 3, 1, True), (2, 2, 7, True)]


def test_a_stray_token_for_a_chunk_is_dropped() -> None:
    sched = make(max_num_batched_tokens=4)
    seq = sched.add(0, [1] * 6, SamplingParams())
    assert not sched.schedule().seqs[0].sampled
    assert sched.update({0: 5}) == [] and seq.output_ids == []
    assert rows(sched.schedule()) == [(0, 4, 2, True)]


def test_a_budget_of_one_token_still_feeds_every_prompt() -> None:
    sched = make(max_num_batched_tokens=1, max_seq_len=16)
    seq = sched.add(0, [1, 2, 3], SamplingParams(max_tokens=2))
    fed = [rows(step(sched, 4)) for _ in range(4)]
    assert fed == [[(0, 0, 1, False)], [(0, 1, 1, False)], [(0, 2, 1, True)], [(0, 3, 1, True)]]
    assert seq.is_finished and seq.output_ids == [4, 4]


def test_prefill_then_decode_feeds_the_last_token_at_its_position() -> None:
    sched = make()
    sched.add(0, [5, 6, 7], SamplingParams())
    sched.add(1, [8], SamplingParams())
    assert sched.schedule().is_prefill
    sched.update({0: 10, 1: 11})
    decode = sched.schedule()
    assert not decode.is_prefill
    assert [(s.seq_id, s.token_ids, s.start_pos) for s in decode.seqs] == [
        (0, (10,), 3),
        (1, (11,), 1),
    ]
    sched.update({0: 12, 1: 13})
    again = sched.schedule()
    assert [(s.token_ids, s.start_pos) for s in again.seqs] == [((12,), 4), ((13,), 2)]


def test_a_new_prompt_is_fed_beside_the_running_decodes() -> None:
    sched = make()
    sched.add(0, [1], SamplingParams())
    step(sched, 2)
    sched.add(1, [3, 4], SamplingParams())
    batch = sched.schedule()
    assert batch.is_prefill
    assert [(s.seq_id, s.token_ids, s.start_pos) for s in batch.seqs] == [
        (0, (2,), 1),
        (1, (3, 4), 0),
    ]
    sched.update({0: 6, 1: 5})
    assert not sched.schedule().is_prefill


def test_empty_scheduler_returns_an_empty_batch() -> None:
    sched = make()
    batch = sched.schedule()
    assert batch.is_empty
    assert not sched.has_work
    assert (sched.pending, sched.free_slots) == (0, 8)


def test_introspection_follows_the_lifecycle() -> None:
    sched = make(num_slots=1)
    a = sched.add(0, [1], SamplingParams(max_tokens=1))
    sched.add(1, [1], SamplingParams(max_tokens=1))
    assert (sched.num_waiting, sched.num_running, sched.pending, sched.has_work) == (2, 0, 2, True)
    sched.schedule()
    assert sched.get(0) is a and a.status.value == "running"
    assert (sched.num_waiting, sched.num_running, sched.pending, sched.free_slots) == (1, 1, 2, 0)
    sched.update({0: 3})
    assert a.is_finished and sched.get(0) is None
    assert (sched.num_waiting, sched.num_running, sched.free_slots) == (1, 0, 1)


def test_abort_a_waiting_request() -> None:
    sched = make(num_slots=1)
    sched.add(0, [1], SamplingParams())
    waiting = sched.add(1, [1], SamplingParams())
    sched.add(2, [1], SamplingParams())
    sched.schedule()
    assert sched.abort(1)
    assert waiting.finish_reason is FinishReason.ABORT
    assert waiting.is_finished
    assert sched.num_waiting == 1
    assert not sched.abort(1)  # idempotent
    assert sched.abort(0)
    assert sched.schedule().seq_ids == (2,)


def test_abort_a_running_request_frees_its_slot_and_drops_its_token() -> None:
    sched = make(num_slots=2)
    a = sched.add(0, [1], SamplingParams())
    sched.add(1, [1], SamplingParams())
    sched.schedule()
    assert sched.free_slots == 0
    assert sched.abort(0)
    assert (a.slot, a.finish_reason, sched.free_slots) == (None, FinishReason.ABORT, 1)
    assert sched.update({0: 5, 1: 5}) == []  # the in-flight step's token for 0 is dropped
    assert a.output_ids == []
    assert sched.schedule().seq_ids == (1,)
    assert not sched.abort(0)


def test_abort_unknown_id_is_false() -> None:
    assert not make().abort(42)


def test_preempt_puts_the_sequence_first_with_its_prompt_extended() -> None:
    sched = make(num_slots=2, max_seq_len=64)
    victim = sched.add(0, [1, 2], SamplingParams(max_tokens=3))
    sched.add(1, [3], SamplingParams())
    sched.add(2, [4], SamplingParams())  # waits: both slots taken
    step(sched, 7)
    step(sched, 8)
    assert victim.output_ids == [7, 8]
    sched.preempt(0)
    assert (victim.status, victim.slot, victim.num_preemptions) == (SequenceStatus.WAITING, None, 1)
    assert (sched.free_slots, sched.num_waiting) == (1, 2)
    batch = sched.schedule()
    assert started(batch) == (0,)  # ahead of request 2, which waited longer
    assert (batch.seqs[1].token_ids, batch.seqs[1].start_pos) == ((1, 2, 7, 8), 0)
    assert victim.prompt_ids == (1, 2)  # usage still counts the client's prompt
    sched.update({0: 9, 1: 9})
    assert victim.finish_reason is FinishReason.LENGTH  # outputs before preemption still count
    assert victim.visible_text() == "hij"


def test_token_for_a_preempted_sequence_is_dropped() -> None:
    sched = make()
    seq = sched.add(0, [1], SamplingParams())
    sched.schedule()
    sched.preempt(0)
    assert sched.update({0: 5}) == []
    assert seq.output_ids == []


def test_preempt_needs_a_running_sequence() -> None:
    sched = make()
    sched.add(0, [1], SamplingParams())
    with pytest.raises(UnknownSequence, match="sequence 0 is not running"):
        sched.preempt(0)
    with pytest.raises(UnknownSequence):
        sched.preempt(9)


def test_add_rejects_what_could_never_run() -> None:
    sched = make(max_seq_len=8)
    with pytest.raises(EmptyPrompt, match="prompt is empty"):
        sched.add(0, [], SamplingParams())
    with pytest.raises(PromptTooLong, match="8 tokens, at most 7") as err:
        sched.add(0, [1] * 8, SamplingParams())
    assert (err.value.prompt_len, err.value.limit) == (8, 7)
    assert sched.add(0, [1] * 7, SamplingParams()).max_tokens == 1
    assert sched.num_waiting == 1


def test_add_rejects_live_duplicates_but_reuses_finished_ids() -> None:
    sched = make()
    sched.add(0, [1], SamplingParams(max_tokens=1))
    with pytest.raises(DuplicateSequence):
        sched.add(0, [1], SamplingParams())  # waiting
    sched.schedule()
    with pytest.raises(DuplicateSequence):
        sched.add(0, [1], SamplingParams())  # running
    sched.update({0: 1})
    assert sched.add(0, [2], SamplingParams()).prompt_ids == (2,)
