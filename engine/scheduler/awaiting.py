"""A request's other choices while their parent's prompt is prefilled, chunk by chunk.

A request's n choices share one prefill: the first (the parent) is fed the prompt, the others
(children) hold their slots and are fed nothing until the step that feeds the parent's last
chunk. That step gives them the prompt's KV (the scheduler forks the parent's blocks) and
each a token from the parent's row; from then on each is an ordinary sequence.
"""

from __future__ import annotations

from collections.abc import Mapping

from engine.scheduler.batch import ScheduledSeq
from engine.scheduler.sequence import Sequence
from engine.scheduler.waiting import Members

Shared = tuple[tuple[int, int], ...]  # (child seq_id, its parent's row), as ScheduledBatch
Pairs = tuple[tuple[Sequence, Sequence], ...]  # (parent, child)


class Awaiting:
    def __init__(self) -> None:
        self._parent: dict[int, Sequence] = {}  # child seq_id -> parent

    def __bool__(self) -> bool:
        return bool(self._parent)

    def __contains__(self, seq_id: int) -> bool:
        return seq_id in self._parent

    def add(self, members: Members) -> None:
        """A group just admitted: every member after the first waits for the first."""
        for child in members[1:]:
            self._parent[child.seq_id] = members[0]

    def drop(self, seq: Sequence, running: Mapping[int, Sequence]) -> Sequence | None:
        """`seq` stops running. A child is forgotten; a parent's first waiting child prefills
        the prompt anew in its own slot (returned, the heir), and the others wait for that
        one instead."""
        self._parent.pop(seq.seq_id, None)
        orphans = [child for child, parent in self._parent.items() if parent is seq]
        if not orphans:
            return None
        heir = running[orphans[0]]
        del self._parent[heir.seq_id]
        for child in orphans[1:]:
            self._parent[child] = heir
        return heir

    def forks(
        self, rows: tuple[ScheduledSeq, ...], running: Mapping[int, Sequence]
    ) -> tuple[Pairs, Shared]:
        """Each parent whose prompt is in once this step has run (its row is sampled): its
        children take its KV and draw their first token from its row."""
        forks: list[tuple[Sequence, Sequence]] = []
        shared: list[tuple[int, int]] = []
        done = {row.seq_id: i for i, row in enumerate(rows) if row.sampled}
        for child_id, parent in list(self._parent.items()):
            row = done.get(parent.seq_id)
            if row is None:
                continue
            child = running[child_id]
            forks.append((parent, child))
            shared.append((child_id, row))
            child.num_computed = parent.num_tokens
            del self._parent[child_id]
        return tuple(forks), tuple(shared)
