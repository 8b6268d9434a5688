"""What one engine step runs: an immutable snapshot the model runner can read freely."""

from __future__ import annotations

from dataclasses import dataclass

from engine.scheduler.sequence import SamplingParams


@dataclass(frozen=True, slots=True)
class ScheduledSeq:
    """Feed `token_ids` at positions `start_pos, start_pos + 1, ...` into KV slot `slot`."""

    seq_id: int
    slot: int
    token_ids: tuple[int, ...]
    start_pos: int
    params: SamplingParams


@dataclass(frozen=True, slots=True)
class ScheduledBatch:
    """Either all prefills or all decodes, never mixed (vLLM v0 style).

    `num_waiting` is the queue depth left after this step: requests held back by full slots,
    `max_num_seqs` or the token budget.
    """

    seqs: tuple[ScheduledSeq, ...]
    is_prefill: bool
    num_waiting: int

    @property
    def is_empty(self) -> bool:
        return not self.seqs

    @property
    def num_tokens(self) -> int:
        return sum(len(s.token_ids) for s in self.seqs)

    @property
    def seq_ids(self) -> tuple[int, ...]:
        return tuple(s.seq_id for s in self.seqs)
