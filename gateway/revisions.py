"""Which revision each cell serves, and how a rollout splits one cell between two revisions.

Outside a rollout a cell serves one revision: the one its configured units carry (the first
unit added to an empty cell sets it), or the last rollout's target. A unit of another revision
is kept out of routing and says why. During a rollout the cells already moved serve the new
revision, the cell being moved gives the new revision `share` of its conversations, and the
others serve the old one; `serving` changes only when a rollout succeeds, so rolling back is
the canary's removal.

Which revision a request gets in the cell being moved is its *draw*: a number in [0, 1) hashed
from its conversation (the session that affinity reads) and the rollout's id, so a
conversation keeps its revision through the rollout (its answers stay consistent, its prefix
cached) and two rollouts split the conversations differently. A request without a session
draws at random. It gets the new revision when its draw is below the share.

A cell's share of the traffic follows its serving units' weights, as outside a rollout; while
a rollout runs, the new revision's units in the cells it has reached have their weights scaled
so that together they weigh what the cell's old units weigh. A cell of two old units and one
new one keeps its share whichever revision a request draws.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from hashlib import blake2b
from random import Random
from types import MappingProxyType

_EMPTY: Mapping[str, str] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Canary:
    """A running rollout, as routing applies it."""

    id: str  # the rollout's id: it salts each conversation's draw
    old: str  # the revision being replaced
    new: str
    cells: frozenset[str]  # every cell the rollout moves
    moved: frozenset[str] = frozenset()  # cells already serving `new` (their old units drained)
    cell: str | None = None  # the cell being moved now
    share: float = 0.0  # of that cell's conversations that get `new`, 0 to 1
    # Whether a stream broken on a new unit may resume on an old one: their token ids mean
    # the same tokens (False when the new revision changes the tokenizer).
    resume_across: bool = True
    # Bumped by the driver at each step and resume: the answers collected start over.
    epoch: int = 0

    def revision(self, cell: str, serving: str, moving: bool) -> str:
        """The revision `cell` serves a request that drew `moving` (below the share)."""
        if cell in self.moved or (moving and cell == self.cell):
            return self.new
        return serving

    def reached(self, cell: str) -> bool:
        """Whether the new revision serves in `cell` now (its units' weights are scaled)."""
        return cell in self.moved or (cell == self.cell and self.share > 0)


@dataclass(frozen=True, slots=True)
class Revisions:
    serving: Mapping[str, str] = field(default_factory=lambda: _EMPTY)  # cell -> its revision
    canary: Canary | None = None

    def of(self, cell: str) -> str | None:
        return self.serving.get(cell)

    def with_serving(self, cell: str, revision: str) -> Revisions:
        serving = dict(self.serving)
        serving[cell] = revision
        return Revisions(MappingProxyType(serving), self.canary)


def draw(rollout: str, session: str | None, rng: Random) -> float:
    """A request's draw in [0, 1): stable for a conversation within one rollout."""
    if not session:
        return rng.random()
    digest = blake2b(f"{rollout}\0{session}".encode("utf-8", "surrogatepass"), digest_size=8)
    return int.from_bytes(digest.digest(), "little") / 2.0**64


def to_wire(revisions: Revisions) -> dict[str, object]:
    """As JSON: the workers' state messages and the stores carry it."""
    canary = revisions.canary
    wire: dict[str, object] = {"serving": dict(revisions.serving)}
    if canary is not None:
        wire["canary"] = {
            "id": canary.id,
            "old": canary.old,
            "new": canary.new,
            "cells": sorted(canary.cells),
            "moved": sorted(canary.moved),
            "cell": canary.cell,
            "share": canary.share,
            "resume_across": canary.resume_across,
            "epoch": canary.epoch,
        }
    return wire


def from_wire(wire: Mapping[str, object]) -> Revisions:
    serving = wire.get("serving", {})
    if not isinstance(serving, Mapping):
        raise ValueError(f"revisions: serving must be an object, not {serving!r}")
    raw = wire.get("canary")
    canary = None
    if isinstance(raw, Mapping):
        canary = Canary(
            str(raw["id"]),
            str(raw["old"]),
            str(raw["new"]),
            frozenset(str(c) for c in raw["cells"]),
            frozenset(str(c) for c in raw["moved"]),
            None if raw["cell"] is None else str(raw["cell"]),
            float(raw["share"]),
            bool(raw.get("resume_across", True)),
            int(raw.get("epoch", 0)),
        )
    return Revisions(MappingProxyType({str(k): str(v) for k, v in serving.items()}), canary)
