"""Forks on a rank: `apply_forks`, and the follower loop applying a step message's forks."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch

from engine.model import ModelConfig, Transformer, init_from_seed
from engine.runtime.follower import run_follower
from engine.runtime.forks import apply_forks
from engine.runtime.health import NodeStats
from engine.runtime.messages import Command, StepMessage
from engine.scheduler import SamplingParams, Scheduler, SchedulerConfig

PROMPT = [256, *b"one prompt, three choices", 260]


def model() -> Transformer:
    return init_from_seed(ModelConfig.tiny(), seed=1, num_slots=4)


def same_prefix(m: Transformer, src: int, dst: int, length: int) -> bool:
    k, v = m.cache.k, m.cache.v
    return torch.equal(k[:, src, :length], k[:, dst, :length]) and torch.equal(
        v[:, src, :length], v[:, dst, :length]
    )


def no_text(ids: Sequence[int]) -> str:
    return ""


def greedy(sched: Scheduler, m: Transformer, steps: int) -> dict[int, list[int]]:
    """The leader's step, reduced: forward, forks, one argmax per sampled row."""
    for _ in range(steps):
        batch = sched.schedule()
        logits = m([(s.slot, s.token_ids, s.start_pos) for s in batch.seqs])
        apply_forks(m.cache, batch.forks)
        tokens = logits[list(batch.sample_rows)].argmax(dim=-1).tolist()
        sched.update(dict(zip(batch.sampled_ids, tokens, strict=True)))
    return {i: list(seq.output_ids) for i in range(4) if (seq := sched.get(i)) is not None}


def test_forked_choices_decode_as_the_prompt_alone() -> None:
    params = SamplingParams(temperature=0, max_tokens=50, ignore_eos=True)
    config = SchedulerConfig(max_num_seqs=4, num_slots=4, max_seq_len=128)
    alone = Scheduler(config, frozenset(), no_text)
    alone.add(0, PROMPT, params)
    want = greedy(alone, model(), 6)[0]
    group = Scheduler(config, frozenset(), no_text)
    group.add(3, PROMPT[:5], params)  # another sequence in the batch, and in slot 0
    group.add_group([0, 1, 2], PROMPT, params)
    got = greedy(group, model(), 6)
    assert len(want) == 6
    assert got[0] == got[1] == got[2] == want


def test_apply_forks_copies_every_prefix() -> None:
    m = model()
    m([(1, PROMPT, 0)])
    apply_forks(m.cache, [(1, 0, len(PROMPT)), (1, 3, len(PROMPT))])
    assert same_prefix(m, 1, 0, len(PROMPT)) and same_prefix(m, 1, 3, len(PROMPT))
    assert not same_prefix(m, 1, 2, len(PROMPT))


def test_a_bad_fork_changes_no_slot() -> None:
    m = model()
    m([(1, PROMPT, 0)])
    before = m.cache.k.clone()
    with pytest.raises(ValueError, match="dst_slot"):
        apply_forks(m.cache, [(1, 0, len(PROMPT)), (1, 9, len(PROMPT))])
    assert torch.equal(m.cache.k, before)


def test_the_follower_applies_a_steps_forks_after_its_forward() -> None:
    """The follower loop over a scripted channel (no Gloo: world size 1)."""
    n = len(PROMPT)
    script = iter(
        [
            StepMessage.step([(0, PROMPT, 0)], 3, 3, forks=[(0, 1, n), (0, 2, n)]),
            StepMessage.step([(0, [5], n), (1, [6], n), (2, [7], n)], 3, 3),
            StepMessage(Command.STOP),
        ]
    )
    m, stats = model(), NodeStats("follower", "u", 0, 4)
    assert run_follower(m, stats, receive_step=lambda _group: next(script)) == 0
    assert same_prefix(m, 0, 1, n) and same_prefix(m, 0, 2, n)
    assert not same_prefix(m, 0, 1, n + 1)  # each choice then decoded its own token
    assert stats.snapshot()["step"] == 2


def test_a_follower_given_a_bad_fork_fails_instead_of_diverging() -> None:
    script = iter([StepMessage.step([(0, PROMPT, 0)], 1, 1, forks=[(0, 0, len(PROMPT))])])
    stats = NodeStats("follower", "u", 0, 4)
    assert run_follower(model(), stats, receive_step=lambda _group: next(script)) == 1
    assert stats.failure is not None and "dst_slot" in stats.failure
