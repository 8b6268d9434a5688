"""Several steps in flight (a pipelined unit): sequences in flight are neither fed again nor
preempted, and a step's decodes can be capped so the running ones make two batches."""

from __future__ import annotations

from engine.scheduler import SamplingParams, SequenceStatus
from tests.engine.scheduler_support import make, step


def test_in_flight_sequences_are_skipped_and_the_rest_capped() -> None:
    sched = make(num_slots=8)
    for seq_id in range(6):
        sched.add(seq_id, [1, 2], SamplingParams(max_tokens=16))
    step(sched, 5)  # all six prefilled, each with its first token
    first = sched.schedule(singles_limit=3)
    assert first.seq_ids == (0, 1, 2)
    second = sched.schedule(skip=set(first.seq_ids), singles_limit=3)
    assert second.seq_ids == (3, 4, 5)
    assert sched.schedule(skip={0, 1, 2, 3, 4, 5}).is_empty  # all in flight: nothing to feed
    sched.update(dict.fromkeys(first.seq_ids, 7))
    assert sched.schedule(skip=set(second.seq_ids), singles_limit=3).seq_ids == (0, 1, 2)


def test_a_sequence_in_flight_is_not_preempted_for_a_better_one() -> None:
    sched = make(num_slots=2)
    for seq_id in (0, 1):
        sched.add(seq_id, [1], SamplingParams(max_tokens=16, priority=2))
    step(sched, 5)
    sched.add(2, [1], SamplingParams(max_tokens=16, priority=0))
    flying = sched.schedule(skip={1}, singles_limit=1)  # 1 is in flight: 0 makes room
    zero = sched.get(0)
    assert zero is not None and zero.status is SequenceStatus.WAITING
    assert flying.seq_ids == (2,)
    sched.add(3, [1], SamplingParams(max_tokens=16, priority=0))
    assert sched.schedule(skip={1, 2}).is_empty  # only sequences in flight could make room
    seq = sched.get(1)
    assert seq is not None and seq.status is SequenceStatus.RUNNING
