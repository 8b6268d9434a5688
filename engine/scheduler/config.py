"""Scheduler limits, validated when built so a bad deployment fails at start-up."""

from __future__ import annotations

from dataclasses import dataclass

from engine.scheduler.errors import InvalidConfig


def _check(ok: bool, name: str, value: object, problem: str) -> None:
    if not ok:
        raise InvalidConfig(name, value, problem)


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    max_num_seqs: int = 8  # sequences running at once (the decode batch size)
    max_num_batched_tokens: int = 2048  # token budget of one prefill step
    num_slots: int = 8  # KV cache slots; one per running sequence
    max_seq_len: int = 2048  # tokens one slot holds: prompt + output

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens", "num_slots"):
            value = getattr(self, name)
            _check(isinstance(value, int) and value >= 1, name, value, "must be an integer >= 1")
        ok_len = isinstance(self.max_seq_len, int) and self.max_seq_len >= 2
        # One prompt token plus one generated token is the smallest useful sequence.
        _check(ok_len, "max_seq_len", self.max_seq_len, "must be an integer >= 2")
        # A decode step feeds one token per running sequence; it must fit one step's budget.
        _check(
            self.max_num_batched_tokens >= self.max_num_seqs,
            "max_num_batched_tokens",
            self.max_num_batched_tokens,
            f"must be >= max_num_seqs ({self.max_num_seqs})",
        )
