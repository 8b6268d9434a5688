"""Priority scheduling: queue order by (priority, arrival), and preemption at full batch."""

from __future__ import annotations

from engine.scheduler import SamplingParams, Scheduler, SequenceStatus
from tests.engine.scheduler_support import EOS, make, rows, started, step


def add(
    sched: Scheduler, seq_id: int, priority: int, n_prompt: int = 1, max_tokens: int = 16
) -> None:
    sched.add(seq_id, [1] * n_prompt, SamplingParams(max_tokens=max_tokens, priority=priority))


def status(sched: Scheduler, seq_id: int) -> SequenceStatus:
    seq = sched.get(seq_id)
    assert seq is not None
    return seq.status


def test_lower_priority_values_go_first_and_ties_keep_arrival_order() -> None:
    sched = make()
    for seq_id, priority in [(0, 2), (1, 0), (2, 1), (3, 0), (4, -1)]:
        add(sched, seq_id, priority)
    assert sched.schedule().seq_ids == (4, 1, 3, 2, 0)


def test_admission_does_not_skip_a_head_that_takes_the_whole_budget() -> None:
    sched = make(max_num_batched_tokens=8)
    add(sched, 0, 1, n_prompt=4)
    add(sched, 1, 0, n_prompt=10)
    add(sched, 2, 0, n_prompt=2)  # would fit, but 1 is first in line and takes all 8
    assert rows(step(sched, 5)) == [(1, 0, 8, False)]
    assert rows(sched.schedule()) == [(1, 8, 2, True), (2, 0, 2, True), (0, 0, 4, True)]


def test_a_better_head_preempts_the_latest_of_the_worst_running() -> None:
    sched = make(num_slots=3)
    add(sched, 0, 1)
    add(sched, 1, 2)
    add(sched, 2, 2)
    step(sched, 5)
    add(sched, 3, 0)
    batch = sched.schedule()
    assert batch.is_prefill and started(batch) == (3,) and batch.seq_ids == (0, 1, 3)
    assert batch.seqs[2].slot == 2  # the slot sequence 2 gave back
    assert status(sched, 2) is SequenceStatus.WAITING
    assert [status(sched, i) for i in (0, 1, 3)] == [SequenceStatus.RUNNING] * 3
    seq = sched.get(2)
    assert seq is not None and seq.num_preemptions == 1 and seq.output_ids == [5]
    assert batch.num_waiting == 1


def test_max_num_seqs_counts_as_a_full_batch() -> None:
    sched = make(max_num_seqs=1, num_slots=4)
    add(sched, 0, 1)
    step(sched, 5)
    add(sched, 1, 0)
    assert sched.schedule().seq_ids == (1,)
    assert status(sched, 0) is SequenceStatus.WAITING


def test_equal_priority_never_preempts() -> None:
    sched = make(num_slots=1)
    add(sched, 0, 3, max_tokens=5)
    add(sched, 1, 3)
    for _ in range(4):
        assert step(sched, 5).seq_ids == (0,)
    assert status(sched, 1) is SequenceStatus.WAITING
    assert step(sched, 5).seq_ids == (0,)  # the fifth token ends 0
    assert step(sched, 5).seq_ids == (1,)
    seq = sched.get(1)
    assert seq is not None and seq.num_preemptions == 0


def test_preemption_is_one_way_no_thrash() -> None:
    """The preempted sequence is worse than its replacement, so it cannot take the slot back:
    one preemption, then it waits until the better sequence finishes."""
    sched = make(num_slots=1)
    worse = sched.add(0, [1], SamplingParams(priority=1, max_tokens=3))
    step(sched, 5)
    add(sched, 1, 0, max_tokens=3)
    ran = [step(sched, 5).seq_ids for _ in range(7)]
    assert ran == [(1,), (1,), (1,), (0,), (0,), (), ()]  # 0 had one token before
    assert not sched.has_work
    assert (worse.num_preemptions, worse.output_ids) == (1, [5, 5, 5])


def test_a_preempted_sequence_goes_back_at_the_front_of_its_priority() -> None:
    sched = make(num_slots=2)
    add(sched, 0, 1)
    add(sched, 1, 1)
    step(sched, 5)
    add(sched, 2, 1)  # same priority, arrived after the running ones
    add(sched, 3, 0)  # preempts 1
    add(sched, 4, 0)  # preempts 0
    assert sched.schedule().seq_ids == (3, 4)
    sched.update({3: EOS, 4: EOS})
    # 0 and 1 arrived before 2; among themselves, in arrival order.
    batch = sched.schedule()
    assert batch.seq_ids == (0, 1)
    assert [s.token_ids for s in batch.seqs] == [(1, 5), (1, 5)]  # recomputed with outputs


def test_a_manually_preempted_sequence_waits_behind_better_priorities() -> None:
    sched = make(num_slots=1)
    add(sched, 0, 1)
    step(sched, 5)
    add(sched, 1, 1)
    add(sched, 2, 0)  # preempts 0 on the next schedule
    sched.preempt(0)
    assert sched.schedule().seq_ids == (2,)
    sched.update({2: EOS})
    assert sched.schedule().seq_ids == (0,)  # before 1, which arrived later


def test_a_sequence_preempted_by_schedule_is_not_readmitted_and_loses_its_in_flight_token() -> None:
    sched = make(num_slots=2)
    add(sched, 0, 1)
    add(sched, 1, 1)
    step(sched, 5)
    add(sched, 2, 0)
    batch = sched.schedule()
    assert started(batch) == (2,) and batch.seq_ids == (0, 2)
    assert sched.update({1: 6, 2: 7}) == []  # a token for 1 sampled before it was preempted
    seq = sched.get(1)
    assert seq is not None and seq.output_ids == [5]
    assert status(sched, 1) is SequenceStatus.WAITING


def test_no_preemption_for_a_head_the_budget_holds_back() -> None:
    sched = make(num_slots=2, max_num_batched_tokens=8)
    add(sched, 0, 1)
    add(sched, 1, 1)
    step(sched, 5)
    add(sched, 2, 0, n_prompt=8)
    add(sched, 3, 0, n_prompt=8)
    assert started(step(sched, 6)) == (2,)  # 2 takes the whole budget ...
    assert status(sched, 0) is SequenceStatus.RUNNING  # ... so 0 keeps its slot for now
    assert started(sched.schedule()) == (3,)
    assert status(sched, 0) is SequenceStatus.WAITING


def test_several_preemptions_in_one_schedule_take_the_worst_first() -> None:
    sched = make(num_slots=3)
    add(sched, 0, 2)
    add(sched, 1, 1)
    add(sched, 2, 0)
    step(sched, 5)
    add(sched, 3, 0)
    add(sched, 4, 0)
    add(sched, 5, 0)  # no worse sequence left to preempt: waits
    assert sched.schedule().seq_ids == (2, 3, 4)  # 2 decodes, 3 and 4 start
    assert [status(sched, i) for i in (0, 1, 5)] == [SequenceStatus.WAITING] * 3
    assert sched.num_waiting == 3
