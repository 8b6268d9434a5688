"""The leader of a pipelined unit: up to `pp` steps in flight, each on other sequences.

With one step at a time, stage 1 idles while stage 0 works and the other way round. So
the running sequences are cut into `pp` batches (each step takes at most 1/pp of them,
`Scheduler.schedule`'s `singles_limit`), and the leader starts the next batch's step into
stage 0 while the stages after it still run the previous ones, as vLLM's virtual engines
do. A step is finished (its logits received, sampled, the scheduler updated) in the order
it was started, once its hand-over comes back from the last stage; only then can its
sequences be scheduled again (`skip`).

One stream alone is one step at a time, as without a pipeline. Every rank sees the steps
in the order the leader sends them, so the followers need nothing of this.

A sequence in flight is never preempted (the scheduler skips it when making room); one
aborted meanwhile loses that step's token, as the scheduler drops tokens of sequences no
longer running.
"""

from __future__ import annotations

import math
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import torch

from engine.model.pipeline import PipelineStage
from engine.runtime.choices import Choice
from engine.runtime.leader import LeaderEngine
from engine.runtime.messages import StepMessage
from engine.scheduler import ScheduledBatch


@dataclass(slots=True)
class InFlight:
    """A started step: what finishing it needs."""

    batch: ScheduledBatch
    members: list[Choice]
    masks: Future[torch.Tensor] | None


class PipelinedLeader(LeaderEngine):
    """`LeaderEngine` over a `PipelineStage`: the same requests, events and failures."""

    def __init__(self, model: PipelineStage, *args: Any, **kwargs: Any) -> None:
        super().__init__(model, *args, **kwargs)
        self._stage = model
        self._flight: deque[InFlight] = deque()  # engine thread only, oldest first

    @property
    def _depth(self) -> int:
        return self._stage.layout.pp

    def _step(self) -> None:
        """Start a step when the pipeline has room and something to run, else finish the
        oldest one in flight."""
        flight = self._flight
        if len(flight) < self._depth:
            flying = {seq_id for f in flight for seq_id in _seq_ids(f.batch)}
            share = math.ceil(self.scheduler.num_running / self._depth)
            batch = self.scheduler.schedule(skip=flying, singles_limit=max(1, share))
            if not batch.is_empty:
                self._start(batch)
                return
        if flight:
            self._finish(flight.popleft())
        else:
            self._publish()

    def _start(self, batch: ScheduledBatch) -> None:
        entries = [(s.slot, s.token_ids, s.start_pos) for s in batch.seqs]
        pending, used = self.scheduler.pending, self._slots_used
        msg = StepMessage.step(entries, pending, used, batch.forks, batch.tables)
        self._send(msg, self._stage.tp.group)
        members = [self._live[seq_id] for seq_id in batch.sampled_ids]
        masks = self._constraints.start_masks([m.matcher for m in members])
        self._announce(batch)
        self._publish()
        with self._stage.cache.stepping(batch.tables, batch.forks):  # this stage's part
            self._stage.start(entries)
        self._flight.append(InFlight(batch, members, masks))

    def _finish(self, step: InFlight) -> None:
        logits = self._stage.finish()
        sampled = self._sample(step.batch, logits, step.members, step.masks)
        self._collect_tokens()  # a step finished before: its events first
        self.scheduler.update({seq_id: s.token for seq_id, s in sampled.items()})
        self._unpublished = sampled

    def _drain_inbox(self, block: bool) -> bool:
        """Nothing left to schedule: finish what is in flight before waiting."""
        if block:
            self._settle()
        return super()._drain_inbox(block)

    def _settle(self) -> None:
        flight = self._flight
        while flight:
            self._finish(flight.popleft())


def _seq_ids(batch: ScheduledBatch) -> set[int]:
    return {s.seq_id for s in batch.seqs} | set(batch.sampled_ids)
