"""What one engine step runs: an immutable snapshot the model runner can read freely."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from engine.scheduler.sequence import SamplingParams


@dataclass(frozen=True, slots=True)
class ScheduledSeq:
    """Feed `token_ids` at positions `start_pos, start_pos + 1, ...` into KV slot `slot`."""

    seq_id: int
    slot: int
    token_ids: tuple[int, ...]
    start_pos: int
    params: SamplingParams


class Fork(NamedTuple):
    """After the forward, copy KV positions 0..length of `src_slot` into `dst_slot`.

    A tuple of three ints, so it travels in the step message as it is.
    """

    src_slot: int
    dst_slot: int
    length: int


@dataclass(frozen=True, slots=True)
class ScheduledBatch:
    """Either all prefills or all decodes, never mixed (vLLM v0 style).

    `num_waiting` is the queue depth left after this step: requests held back by full slots,
    `max_num_seqs` or the token budget.

    A request's n choices share one prefill: only the first (the parent) has a row in `seqs`.
    Every rank applies `forks` after the forward, giving each other choice (a child) a copy of
    the prompt's KV, and the leader samples each child's first token from its parent's logits:
    `shared` holds (child seq_id, the parent's row in `seqs`). Both are empty in decode steps.
    """

    seqs: tuple[ScheduledSeq, ...]
    is_prefill: bool
    num_waiting: int
    forks: tuple[Fork, ...] = ()
    shared: tuple[tuple[int, int], ...] = ()

    @property
    def is_empty(self) -> bool:
        return not self.seqs

    @property
    def num_tokens(self) -> int:
        return sum(len(s.token_ids) for s in self.seqs)

    @property
    def seq_ids(self) -> tuple[int, ...]:
        """The sequences with a row in the forward's logits, in row order."""
        return tuple(s.seq_id for s in self.seqs)

    @property
    def sampled_ids(self) -> tuple[int, ...]:
        """Every sequence that gets a token from this step: the rows, then the children."""
        if not self.shared:
            return self.seq_ids
        return self.seq_ids + tuple(child for child, _ in self.shared)

    @property
    def sample_rows(self) -> tuple[int, ...]:
        """For each of `sampled_ids`, the logits row its token is sampled from."""
        rows = tuple(range(len(self.seqs)))
        return rows + tuple(row for _, row in self.shared) if self.shared else rows
