"""A request's n choices: admitted together, one prefill, forks; then ordinary sequences."""

from __future__ import annotations

import pytest

from engine.scheduler import (
    BlockCopy,
    DuplicateSequence,
    EmptyPrompt,
    GroupTooLarge,
    InvalidParams,
    SamplingParams,
    SequenceStatus,
)
from tests.engine.scheduler_support import EOS, make, started, step

PROMPT = [5, 6, 7]


def test_one_prefill_row_forks_for_the_children_and_shares_its_logits() -> None:
    sched = make()
    sched.add(0, [9], SamplingParams())
    seqs = sched.add_group([10, 11, 12], PROMPT, SamplingParams(temperature=0.5))
    assert [s.seq_id for s in seqs] == [10, 11, 12]
    batch = sched.schedule()
    assert batch.is_prefill and batch.seq_ids == (0, 10)
    assert (batch.seqs[1].slot, batch.seqs[1].token_ids) == (1, (5, 6, 7))
    assert batch.forks == (BlockCopy(1, 2, 3), BlockCopy(1, 3, 3))
    assert batch.shared == ((11, 1), (12, 1))
    assert batch.sampled_ids == (0, 10, 11, 12)
    assert batch.sample_rows == (0, 1, 1, 1)
    assert batch.num_tokens == 4  # the children cost no prefill
    assert all(s.status is SequenceStatus.RUNNING for s in seqs)


def test_after_the_prefill_children_decode_from_the_prompts_end() -> None:
    sched = make()
    sched.add_group([10, 11], PROMPT, SamplingParams())
    sched.schedule()
    assert sched.update({10: 20, 11: 21}) == []
    decode = sched.schedule()
    assert not decode.is_prefill and decode.forks == () and decode.shared == ()
    assert [(s.seq_id, s.slot, s.token_ids, s.start_pos) for s in decode.seqs] == [
        (10, 0, (20,), 3),
        (11, 1, (21,), 3),
    ]


def test_a_batch_without_groups_has_no_forks() -> None:
    sched = make()
    sched.add(0, [1], SamplingParams())
    batch = sched.schedule()
    assert (batch.forks, batch.shared, batch.sampled_ids, batch.sample_rows) == ((), (), (0,), (0,))


def test_a_group_of_one_is_a_plain_sequence() -> None:
    sched = make()
    sched.add_group([4], PROMPT, SamplingParams())
    batch = sched.schedule()
    assert (batch.seq_ids, batch.forks, batch.shared) == ((4,), (), ())


@pytest.mark.parametrize("limit", [{"num_slots": 3}, {"max_num_seqs": 3}])
def test_a_group_waits_for_all_its_slots_and_holds_the_line(limit: dict[str, int]) -> None:
    sched = make(**limit)
    sched.add(0, [1], SamplingParams(max_tokens=2))
    step(sched, 4)
    sched.add_group([1, 2, 3], PROMPT, SamplingParams())
    sched.add(4, [1], SamplingParams())  # would fit, but may not overtake the group
    assert not step(sched, 4).is_prefill  # room for 2 of 3: nobody is admitted
    assert (sched.num_running, sched.num_waiting) == (0, 4)  # 0 finished on that step
    batch = sched.schedule()
    assert batch.seq_ids == (1,) and len(batch.forks) == 2
    assert batch.num_waiting == 1


def test_a_group_costs_the_token_budget_one_prompt() -> None:
    sched = make(max_num_batched_tokens=8)
    sched.add(0, [1] * 4, SamplingParams())
    sched.add_group([1, 2, 3], [1] * 4, SamplingParams())  # 4 tokens, not 12
    sched.add_group([4, 5], [1] * 2, SamplingParams())  # over the budget now
    assert step(sched, 9).seq_ids == (0, 1)
    assert started(sched.schedule()) == (4,)


def test_groups_wait_in_priority_order() -> None:
    sched = make(num_slots=4)
    sched.add_group([0, 1], PROMPT, SamplingParams(priority=1))
    sched.add_group([2, 3], PROMPT, SamplingParams(priority=0))
    assert sched.schedule().seq_ids == (2, 0)


def test_a_better_group_preempts_enough_worse_sequences_or_none() -> None:
    sched = make(num_slots=3)
    worse = [sched.add(seq_id, [1], SamplingParams(priority=1)) for seq_id in (0, 1)]
    sched.add(2, [1], SamplingParams(priority=0))
    step(sched, 4)
    sched.add_group([3, 4, 5], PROMPT, SamplingParams(priority=0))  # only 2 worse running
    assert not sched.schedule().is_prefill
    assert sched.num_running == 3
    sched.abort(5)  # the group is now two: preempting both worse sequences makes room
    batch = sched.schedule()
    assert started(batch) == (3,) and batch.shared == ((4, 1),)  # row 0: 2 decodes
    assert [seq.status for seq in worse] == [SequenceStatus.WAITING] * 2


def test_groups_that_could_never_run_are_refused() -> None:
    sched = make(num_slots=4)
    with pytest.raises(GroupTooLarge, match="n=5 needs 5 KV slots, this unit has 4") as err:
        sched.add_group(range(5), PROMPT, SamplingParams())
    assert (err.value.seq_id, err.value.n, err.value.limit) == (0, 5, 4)
    assert isinstance(err.value, ValueError)
    narrow = make(num_slots=8, max_num_seqs=2)
    with pytest.raises(GroupTooLarge, match="n=3 needs 3 sequences running at once"):
        narrow.add_group([0, 1, 2], PROMPT, SamplingParams())
    with pytest.raises(InvalidParams, match="n=0"):
        sched.add_group([], PROMPT, SamplingParams())
    with pytest.raises(EmptyPrompt):
        sched.add_group([0, 1], [], SamplingParams())
    assert (sched.pending, narrow.pending) == (0, 0)


def test_duplicate_ids_refuse_the_whole_group() -> None:
    sched = make()
    sched.add(7, [1], SamplingParams())
    with pytest.raises(DuplicateSequence, match="sequence 7"):
        sched.add_group([1, 7], PROMPT, SamplingParams())
    with pytest.raises(DuplicateSequence, match="sequence 2"):
        sched.add_group([2, 3, 2], PROMPT, SamplingParams())
    assert sched.pending == 1
    assert all(sched.get(i) is None for i in (1, 2, 3))


def test_a_preempted_child_is_recomputed_alone() -> None:
    sched = make()
    sched.add_group([1, 2, 3], PROMPT, SamplingParams())
    step(sched, 20)
    step(sched, 21)
    sched.preempt(2)
    batch = sched.schedule()
    assert started(batch) == (2,) and batch.forks == () and batch.shared == ()
    assert (batch.seqs[2].token_ids, batch.seqs[2].start_pos) == ((5, 6, 7, 20, 21), 0)
    sched.update(dict.fromkeys((1, 2, 3), 22))
    assert step(sched, 23).seq_ids == (1, 3, 2)


def test_aborting_a_running_member_leaves_the_others_running() -> None:
    sched = make()
    seqs = sched.add_group([1, 2, 3], PROMPT, SamplingParams())
    step(sched, 20)
    assert sched.abort(2)
    assert sched.free_slots == 6
    assert step(sched, 21).seq_ids == (1, 3)
    assert [s.output_ids for s in seqs] == [[20, 21], [20], [20, 21]]


def test_aborting_a_waiting_parent_lets_the_next_member_prefill() -> None:
    sched = make(num_slots=3)
    sched.add(0, [1], SamplingParams(max_tokens=2))
    step(sched, 4)
    sched.add_group([1, 2, 3], PROMPT, SamplingParams())
    assert sched.num_waiting == 3
    assert sched.abort(1)
    assert sched.num_waiting == 2
    batch = sched.schedule()  # two slots free: the rest of the group fits
    assert started(batch) == (2,) and batch.shared == ((3, 1),)
    assert batch.forks == (BlockCopy(batch.seqs[1].slot, 2, 3),)


def test_a_finished_child_frees_only_its_own_slot() -> None:
    sched = make(num_slots=2)
    sched.add_group([1, 2], PROMPT, SamplingParams())
    sched.schedule()
    finished = sched.update({1: EOS, 2: 20})
    assert [s.seq_id for s in finished] == [1]
    assert sched.schedule().seq_ids == (2,)
