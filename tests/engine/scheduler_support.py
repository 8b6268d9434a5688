"""Helpers shared by the scheduler tests: a fake tokenizer and one-step driving."""

from __future__ import annotations

from collections.abc import Sequence as Seq

from engine.scheduler import ScheduledBatch, Scheduler, SchedulerConfig

EOS = 1000


def letters(ids: Seq[int]) -> str:
    """Fake tokenizer: token i is the letter a + i mod 26; EOS is never decoded by the scheduler."""
    return "".join(chr(ord("a") + i % 26) for i in ids)


def tok(text: str) -> list[int]:
    return [ord(c) - ord("a") for c in text]


def make(**config: int | bool) -> Scheduler:
    return Scheduler(SchedulerConfig(**config), frozenset({EOS}), letters)


def step(sched: Scheduler, token: int) -> ScheduledBatch:
    """Run one step where every scheduled sequence (and child sharing a row) samples `token`."""
    batch = sched.schedule()
    sched.update(dict.fromkeys(batch.sampled_ids, token))
    return batch


def started(batch: ScheduledBatch) -> tuple[int, ...]:
    """The sequences whose first tokens this step feeds (admitted, or recomputed): the rows
    at position 0, whatever the running sequences decode beside them."""
    return tuple(s.seq_id for s in batch.seqs if s.start_pos == 0)


def rows(batch: ScheduledBatch) -> list[tuple[int, int, int, bool]]:
    """Each row as (seq_id, start_pos, tokens fed, sampled)."""
    return [(s.seq_id, s.start_pos, len(s.token_ids), s.sampled) for s in batch.seqs]
