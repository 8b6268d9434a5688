"""Scheduler limits, validated when built so a bad deployment fails at start-up."""

from __future__ import annotations

from dataclasses import dataclass

from engine.prefixcache import blocks_for
from engine.scheduler.errors import InvalidConfig


def _check(ok: bool, name: str, value: object, problem: str) -> None:
    if not ok:
        raise InvalidConfig(name, value, problem)


# Prompt tokens one step feeds by default (chunked prefill). Chosen by measurement (SmolLM2
# on 2 CPU cores, docs/engine.md#chunked-prefill, `python -m loadtest.bench.chunked_prefill`):
# one node's step of 128 beside 4 decodes takes about 0.5 s, 0.63 s at the end of a 2,048
# slot, well inside the gateway's 1.5 s stall_timeout (256: twice that), and a long prompt
# takes about an eighth more time than in one step (64: a quarter more).
DEFAULT_PREFILL_CHUNK = 128


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    max_num_seqs: int = 8  # sequences running at once (the decode batch size)
    # Prompt tokens one step feeds at most: a longer prompt is fed a chunk per step (chunked
    # prefill), the running sequences' decodes riding along outside this budget.
    max_num_batched_tokens: int = DEFAULT_PREFILL_CHUNK
    num_slots: int = 8  # KV cache slots; one per running sequence
    max_seq_len: int = 2048  # tokens one slot holds: prompt + output
    # The paged KV cache (engine.prefixcache): positions per block, and blocks in all (None:
    # enough for every slot's whole sequence, the least there may be, so a running sequence
    # always has room to grow; the rest holds cached prefixes).
    block_size: int = 16
    num_blocks: int | None = None
    prefix_caching: bool = True  # reuse the cached blocks of a prompt's longest prefix

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens", "num_slots", "block_size"):
            value = getattr(self, name)
            _check(isinstance(value, int) and value >= 1, name, value, "must be an integer >= 1")
        ok_len = isinstance(self.max_seq_len, int) and self.max_seq_len >= 2
        # One prompt token plus one generated token is the smallest useful sequence.
        _check(ok_len, "max_seq_len", self.max_seq_len, "must be an integer >= 2")
        if self.num_blocks is not None:
            least = self.least_blocks
            ok = isinstance(self.num_blocks, int) and self.num_blocks >= least
            problem = f"must be at least {least} ({self.num_slots} slots of whole sequences)"
            _check(ok, "num_blocks", self.num_blocks, problem)

    @property
    def least_blocks(self) -> int:
        return self.num_slots * blocks_for(self.max_seq_len, self.block_size)

    @property
    def total_blocks(self) -> int:
        return self.least_blocks if self.num_blocks is None else self.num_blocks
