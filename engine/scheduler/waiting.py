"""The waiting line, served by (priority, arrival): lower priority values first (vLLM's rule),
equal priorities in arrival order.

An entry is what admission takes in one go: one sequence, or the n sequences of one request
that start together. Admission never skips the head, so every running sequence arrived before
every waiting one of its priority; a preempted sequence therefore goes back at the front of
its priority, behind only those preempted before it that arrived earlier.

One deque per priority level: with a single level (every request at the default priority)
adding and admitting are a deque's append and popleft, as in plain FIFO.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Callable

from engine.scheduler.sequence import Sequence

Members = tuple[Sequence, ...]  # one sequence, or a request's n choices; the first prefills


class WaitingQueue:
    def __init__(self, arrival: Callable[[int], int]) -> None:
        """`arrival` maps a live seq_id to its place in line (kept across preemptions)."""
        self._arrival = arrival
        self._lines: dict[int, deque[Members]] = {}  # priority -> entries in arrival order
        self._levels: list[int] = []  # priorities with a non-empty line, best first
        self._len = 0  # sequences, not entries: a group of n counts n

    def __len__(self) -> int:
        return self._len

    def append(self, priority: int, members: Members) -> None:
        """A new request (`priority` is its params'): behind everyone of its priority."""
        line = self._lines.get(priority)
        if line is None:
            line = self._open(priority)
        line.append(members)
        self._len += len(members)

    def put_back(self, seq: Sequence) -> None:
        """A preempted sequence: among those of its priority, by arrival."""
        line = self._lines.get(seq.params.priority)
        if line is None:
            line = self._open(seq.params.priority)
        arrival, i = self._arrival(seq.seq_id), 0
        while i < len(line) and self._arrival(line[i][0].seq_id) < arrival:
            i += 1
        line.insert(i, (seq,))
        self._len += 1

    def head(self) -> Members | None:
        return self._lines[self._levels[0]][0] if self._levels else None

    def pop(self) -> Members:
        line = self._lines[self._levels[0]]
        members = line.popleft()
        if not line:
            self._close(self._levels[0])
        self._len -= len(members)
        return members

    def remove(self, seq: Sequence) -> None:
        """Take one sequence out (an abort); the rest of its group keeps its place in line."""
        line = self._lines.get(seq.params.priority, deque())
        i = next((i for i, ms in enumerate(line) if any(m is seq for m in ms)), None)
        if i is None:
            raise ValueError(f"sequence {seq.seq_id} is not waiting")
        rest = tuple(m for m in line[i] if m is not seq)
        if rest:
            line[i] = rest
        else:
            del line[i]
            if not line:
                self._close(seq.params.priority)
        self._len -= 1

    def _open(self, priority: int) -> deque[Members]:
        line = self._lines[priority] = deque()
        bisect.insort(self._levels, priority)
        return line

    def _close(self, priority: int) -> None:
        del self._lines[priority]
        self._levels.remove(priority)
