"""What one engine step runs: an immutable snapshot the model runner can read freely."""

from __future__ import annotations

from dataclasses import dataclass

from engine.prefixcache import BlockCopy, TableEdit
from engine.scheduler.sequence import SamplingParams


@dataclass(frozen=True, slots=True)
class ScheduledSeq:
    """Feed `token_ids` at positions `start_pos, start_pos + 1, ...` of the sequence in KV slot
    `slot` (its block table says where they live).

    `sampled`: the entry feeds the sequence's last token, so its row's logits give the next
    one. A prompt chunk that is not the prompt's last is fed for its KV alone.
    """

    seq_id: int
    slot: int
    token_ids: tuple[int, ...]
    start_pos: int
    params: SamplingParams
    sampled: bool = True


@dataclass(frozen=True, slots=True)
class ScheduledBatch:
    """One step, decodes and prompt chunks mixed (chunked prefill, as vLLM's V1 engine).

    `seqs` holds every running sequence's next token (a decode: one token each), then the
    prompt chunks the step's token budget allows, in admission order. A long prompt is fed a
    chunk per step, so running streams decode between its chunks and the step count moves.

    `num_waiting` is the queue depth left after this step: requests held back by full slots,
    `max_num_seqs` or the token budget.

    `tables`: every rank applies these edits to its slots' block tables before the forward
    (a sequence just admitted, a new block for a decode, a child's shared prompt blocks).

    A request's n choices share one prefill: only the first (the parent) has a row in `seqs`.
    Each other choice (a child) shares the parent's full prompt blocks (a table edit); every
    rank applies `forks` after the forward, giving it its own copy of the prompt's partial last
    block, and the leader samples each child's first token from its parent's logits: `shared`
    holds (child seq_id, the parent's row in `seqs`). Both are empty unless the step feeds a
    parent's last prompt chunk.
    """

    seqs: tuple[ScheduledSeq, ...]
    num_waiting: int
    forks: tuple[BlockCopy, ...] = ()
    shared: tuple[tuple[int, int], ...] = ()
    tables: tuple[TableEdit, ...] = ()

    @property
    def is_empty(self) -> bool:
        return not self.seqs

    @property
    def is_prefill(self) -> bool:
        """Some entry feeds a prompt: several tokens, or a sequence's first position."""
        return any(len(s.token_ids) > 1 or s.start_pos == 0 for s in self.seqs)

    @property
    def all_rows_sampled(self) -> bool:
        """The forward's logits are the sampling rows as they are: no partial chunk to skip,
        no child sharing its parent's row."""
        return not self.shared and all(s.sampled for s in self.seqs)

    @property
    def num_tokens(self) -> int:
        return sum(len(s.token_ids) for s in self.seqs)

    @property
    def seq_ids(self) -> tuple[int, ...]:
        """The sequences with a row in the forward's logits, in row order."""
        return tuple(s.seq_id for s in self.seqs)

    @property
    def sampled_ids(self) -> tuple[int, ...]:
        """Every sequence that gets a token from this step: the sampled rows, then the
        children."""
        rows = tuple(s.seq_id for s in self.seqs if s.sampled)
        return rows + tuple(child for child, _ in self.shared) if self.shared else rows

    @property
    def sample_rows(self) -> tuple[int, ...]:
        """For each of `sampled_ids`, the logits row its token is sampled from."""
        rows = tuple(i for i, s in enumerate(self.seqs) if s.sampled)
        return rows + tuple(row for _, row in self.shared) if self.shared else rows
