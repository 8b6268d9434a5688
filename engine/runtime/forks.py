"""Forks: a request's other choices take a copy of their parent's prompt KV, not a prefill.

Every rank applies a step's forks right after its forward, which wrote the parents' prompts;
the leader and the followers do the same copies, so each rank's shard of a slot stays the
same sequence's.
"""

from __future__ import annotations

from collections.abc import Iterable

from engine.model.kvcache import KVCache


def apply_forks(cache: KVCache, forks: Iterable[tuple[int, int, int]]) -> None:
    """Copy (src_slot, dst_slot, length) prefixes in order; all are checked first, so a bad
    fork raises before any slot changes."""
    forks = tuple(forks)
    for src, dst, length in forks:
        cache.check_copy(src, dst, length)
    for src, dst, length in forks:
        cache.copy_prefix(src, dst, length)
