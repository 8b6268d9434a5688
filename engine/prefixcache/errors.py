"""Typed errors of the block pool, so a scheduler acts on them without parsing messages."""

from __future__ import annotations


class PoolError(Exception):
    """Base for everything the block pool raises on purpose."""


class OutOfBlocks(PoolError):
    """An operation needed more blocks than are free or evictable; nothing was changed.

    The request may wait (admission) or a running sequence may be preempted to make room
    (growth): `needed` and `available` say by how much it fell short."""

    def __init__(self, seq_id: int, needed: int, available: int) -> None:
        super().__init__(
            f"sequence {seq_id}: needs {needed} KV blocks, {available} are free or evictable"
        )
        self.seq_id, self.needed, self.available = seq_id, needed, available


class UnknownSequence(PoolError, LookupError):
    def __init__(self, seq_id: int) -> None:
        super().__init__(f"sequence {seq_id} holds no blocks")
        self.seq_id = seq_id


class DuplicateSequence(PoolError, ValueError):
    def __init__(self, seq_id: int) -> None:
        super().__init__(f"sequence {seq_id} already holds blocks")
        self.seq_id = seq_id
