"""The blocks no sequence holds, in the order the pool hands them out again.

Two kinds, as vLLM's free block queue orders them (v1/core/block_pool.py, `free_blocks`):
- blank blocks (no hash: never filled, or a second copy of a hash another block holds),
  reused first, the last released first;
- cached blocks (a hash a new request may still hit), reused only when no blank one is left,
  the least recently released first (LRU). A hit takes its block back out of the queue.
"""

from __future__ import annotations

from collections import OrderedDict


class FreeBlocks:
    def __init__(self, num_blocks: int) -> None:
        self._blank = list(range(num_blocks - 1, -1, -1))  # a stack: block 0 is taken first
        self._cached: OrderedDict[int, None] = OrderedDict()  # least recently released first

    def __len__(self) -> int:
        return len(self._blank) + len(self._cached)

    @property
    def num_cached(self) -> int:
        return len(self._cached)

    def is_cached(self, block: int) -> bool:
        return block in self._cached

    def eviction_order(self) -> tuple[int, ...]:
        """The cached blocks, the next one evicted first."""
        return tuple(self._cached)

    def release_blank(self, block: int) -> None:
        self._blank.append(block)

    def release_cached(self, block: int) -> None:
        self._cached[block] = None

    def claim(self, block: int) -> None:
        """A cached block a new sequence hit: no longer evictable."""
        del self._cached[block]

    def take(self) -> tuple[int, bool]:
        """A block to write into, and whether it was cached (its hash is to be evicted)."""
        if self._blank:
            return self._blank.pop(), False
        block, _ = self._cached.popitem(last=False)
        return block, True

    def blank_all(self) -> None:
        """Every cached block forgets its hash (the pool was reset)."""
        self._blank.extend(reversed(self._cached))
        self._cached.clear()
