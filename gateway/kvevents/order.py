"""Where one unit's event stream stands, batch by batch: which batch to apply, which to skip,
when to ask the publisher's replay socket for what was missed, and when the unit's entries
can no longer be trusted and must be dropped. Pure and synchronous; the subscriber
(subscriber.py) does the I/O and follows these verdicts.

vLLM numbers its batches 0, 1, 2, ... from its engine's start, and keeps the last ones
(`buffer_steps`, 10,000 by default) for replay. So:
- the next number is applied;
- a number past the next one is a gap: the batches between were lost (a slow subscriber, a
  full queue), and are asked for by replay from the first one missed;
- a number at or below the last one applied is a restarted engine (its count began again),
  unless it is a batch the subscriber already has: a replay overlaps what then arrives live,
  up to the replay's last batch;
- a replay that cannot give the first batch missed (the buffer moved on, no replay socket, or
  no answer in time) leaves the unit's entries incomplete: a lost removal would claim blocks
  the unit no longer holds, so they are dropped and the stream goes on from there.
"""

from __future__ import annotations

import enum


class Step(enum.Enum):
    APPLY = "apply"
    SKIP = "skip"  # already applied (a replay's overlap with the live stream)
    GAP = "gap"  # batches were missed: replay from `Order.want`
    RESTART = "restart"  # the engine started again: drop the unit's entries, replay from 0


class Order:
    def __init__(self) -> None:
        self.last: int | None = None  # the last batch applied
        self._overlap = -1  # live batches up to this one were already replayed

    @property
    def want(self) -> int:
        """The first batch not yet applied (what a replay starts from)."""
        return 0 if self.last is None else self.last + 1

    def live(self, seq: int) -> Step:
        """The verdict on a batch from the live stream."""
        if seq == self.want:
            self._overlap = -1  # the live stream is in order: no replayed batch comes after
            return Step.APPLY
        if self.last is not None and seq <= self.last:
            return Step.SKIP if seq <= self._overlap else Step.RESTART
        return Step.GAP

    def replayed(self, seq: int) -> Step:
        """The verdict on a batch a replay sent: only the next one is applied; one before it is
        skipped; one past it means the publisher no longer has the batches between."""
        if seq == self.want:
            return Step.APPLY
        if self.last is not None and seq <= self.last:
            return Step.SKIP
        return Step.GAP

    def applied(self, seq: int) -> None:
        self.last = seq

    def replay_done(self) -> None:
        """A replay ended: what arrives live up to its last batch is the overlap."""
        if self.last is not None:
            self._overlap = self.last

    def restart(self) -> None:
        """Begin again from nothing (the unit's entries were dropped)."""
        self.last = None
        self._overlap = -1

    def resume_at(self, seq: int) -> None:
        """Go on from `seq` after a gap that could not be filled (the unit's entries dropped)."""
        self.last = seq - 1
        self._overlap = -1
