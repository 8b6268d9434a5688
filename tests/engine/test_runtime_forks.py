"""Forks on a rank: children share their parent's full prompt blocks and copy its partial last
one, in the leader's steps and in the follower loop applying a step message's edits and copies."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from engine.model import ModelConfig, Transformer, init_from_seed
from engine.runtime.follower import run_follower
from engine.runtime.health import NodeStats
from engine.runtime.messages import Command, StepMessage
from engine.scheduler import SamplingParams, Scheduler, SchedulerConfig

PROMPT = [256, *b"one prompt, three choices", 260]  # 27 tokens: a full block and 11 more


def model() -> Transformer:
    return init_from_seed(ModelConfig.tiny(), seed=1, num_slots=4)


def same_prefix(m: Transformer, a: int, b: int, length: int) -> bool:
    """Slots a and b hold the same keys and values at positions 0..length."""
    ka, va = m.cache.read(0, m.cache.span(a, 0, length).read)
    kb, vb = m.cache.read(0, m.cache.span(b, 0, length).read)
    return torch.equal(ka, kb) and torch.equal(va, vb)


def no_text(ids: Sequence[int]) -> str:
    return ""


def greedy(sched: Scheduler, m: Transformer, steps: int) -> dict[int, list[int]]:
    """The leader's step, reduced: tables, forward, forks, one argmax per sampled row."""
    for _ in range(steps):
        batch = sched.schedule()
        m.cache.set_tables(batch.tables)
        logits = m([(s.slot, s.token_ids, s.start_pos) for s in batch.seqs])
        m.cache.copy_blocks(batch.forks)
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


def test_the_follower_applies_a_steps_tables_before_and_forks_after_its_forward() -> None:
    """The follower loop over a scripted channel (no Gloo: world size 1)."""
    n, partial = len(PROMPT), len(PROMPT) - 16
    script = iter(
        [
            StepMessage.step(
                [(0, PROMPT, 0)],
                3,
                3,
                forks=[(1, 5, partial), (1, 6, partial)],
                tables=[(0, 0, (0, 1)), (1, 0, (0, 5)), (2, 0, (0, 6))],
            ),
            StepMessage.step([(0, [5], n), (1, [6], n), (2, [7], n)], 3, 3),
            StepMessage(Command.STOP),
        ]
    )
    m, stats = model(), NodeStats("follower", "u", 0, 4)
    assert run_follower(m, stats, receive_step=lambda _group: next(script)) == 0
    assert m.cache.table(1)[:2] == (0, 5)
    assert same_prefix(m, 0, 1, n) and same_prefix(m, 0, 2, n)
    assert not same_prefix(m, 0, 1, n + 1)  # each choice then decoded its own token
    assert stats.snapshot()["step"] == 2


def test_a_follower_given_a_bad_fork_fails_instead_of_diverging() -> None:
    script = iter([StepMessage.step([(0, PROMPT, 0)], 1, 1, forks=[(1, 1, 11)])])
    stats = NodeStats("follower", "u", 0, 4)
    assert run_follower(model(), stats, receive_step=lambda _group: next(script)) == 1
    assert stats.failure is not None and "dst" in stats.failure
