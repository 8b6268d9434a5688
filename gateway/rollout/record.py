"""A rollout as it is kept and shown: its ask, where it is, and how it ended.

The record is the rollout's whole state: written to the store at every step, verdict and end,
it is what a restarted gateway carries on from (the same cell and step, the step's samples
collected again) and what `GET /admin/rollouts` lists.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from gateway.rollout.gates import Verdict

State = Literal["running", "paused", "succeeded", "rolled_back", "aborted"]
STATES: tuple[State, ...] = ("running", "paused", "succeeded", "rolled_back", "aborted")
LIVE: frozenset[str] = frozenset({"running", "paused"})


@dataclass(slots=True)
class Record:
    id: str
    spec: dict[str, Any]  # the ask, as Spec.wire() gives it
    who: str
    started: float  # Unix time
    state: State = "running"
    cell: int = 0  # index into the spec's cells
    step: int = -1  # index into its steps; -1 while the cell's new units are awaited
    since: float = 0.0  # Unix time the current phase (waiting, step) began
    share: float = 0.0  # of the current cell's conversations on the new revision
    reason: str = ""  # why it is in its state (the failed gate and its figures, ...)
    gates: list[dict[str, Any]] = field(default_factory=list)  # each gate's last verdict
    drained: list[str] = field(default_factory=list)  # old units it drained (back on rollback)
    prepared: int = -1  # the last cell whose prepare hooks ran
    epoch: int = 0  # of the split: each step, resume and restart collects anew
    ended: float | None = None

    @property
    def live(self) -> bool:
        return self.state in LIVE

    @property
    def current_cell(self) -> str | None:
        cells = self.spec["cells"]
        return cells[self.cell] if self.live and self.cell < len(cells) else None

    def view(self) -> dict[str, Any]:
        """The admin API's answer (GET /admin/rollouts/current)."""
        steps = self.spec["steps"]
        return {
            "id": self.id,
            "state": self.state,
            "from": self.spec["from"],
            "to": self.spec["to"],
            "cells": self.spec["cells"],
            "cell": self.current_cell,
            "step": None if self.step < 0 else self.step,
            "steps": steps,
            "share": self.share,
            "gates": self.gates,
            "reason": self.reason,
            "who": self.who,
            "started": self.started,
            "since": self.since,
            "ended": self.ended,
            "drained": self.drained,
            "spec": self.spec,
        }

    def wire(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "spec": self.spec,
            "who": self.who,
            "started": self.started,
            "state": self.state,
            "cell": self.cell,
            "step": self.step,
            "since": self.since,
            "share": self.share,
            "reason": self.reason,
            "gates": self.gates,
            "drained": self.drained,
            "prepared": self.prepared,
            "epoch": self.epoch,
            "ended": self.ended,
        }

    @classmethod
    def from_wire(cls, wire: dict[str, Any]) -> Record:
        state = wire["state"]
        if state not in STATES:
            raise ValueError(f"rollout {wire.get('id')!r} has unknown state {state!r}")
        return cls(
            id=str(wire["id"]),
            spec=dict(wire["spec"]),
            who=str(wire["who"]),
            started=float(wire["started"]),
            state=state,
            cell=int(wire["cell"]),
            step=int(wire["step"]),
            since=float(wire["since"]),
            share=float(wire["share"]),
            reason=str(wire["reason"]),
            gates=list(wire["gates"]),
            drained=[str(u) for u in wire["drained"]],
            prepared=int(wire.get("prepared", -1)),
            epoch=int(wire.get("epoch", 0)),
            ended=None if wire.get("ended") is None else float(wire["ended"]),
        )


def verdict_json(verdict: Verdict) -> dict[str, Any]:
    return {
        "gate": verdict.gate,
        "outcome": verdict.outcome,
        "figures": verdict.figures,
        "reason": verdict.reason,
    }
