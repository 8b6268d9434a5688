"""What an operator asks of a rollout, checked before anything about the fleet changes.

`POST /admin/rollouts` carries the target revision and, optionally, the revision it replaces,
the cells in order, the steps, the gates' settings, golden prompts and the names of hooks the
config defines (a request never carries a command to run). Every mistake is refused with the
field's name; defaults come from `[rollout]`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from gateway.config.rollout import RolloutConfig
from gateway.rollout.gates import GateSettings
from gateway.rollout.golden import GoldenError, GoldenItem, parse_golden

FIELDS = frozenset(
    {
        "to",
        "from",
        "cells",
        "steps",
        "step_seconds",
        "ready_timeout",
        "gates",
        "golden",
        "hooks",
        "resume_across",
        "reason",
    }
)


class SpecError(ValueError):
    """A request field is wrong: the rollout is not started."""

    def __init__(self, field: str, message: str, named: bool = False) -> None:
        """`named`: the message names its fields itself (golden[2].compare: ...)."""
        super().__init__(message if named else f"{field}: {message}")
        self.field = field


@dataclass(frozen=True, slots=True)
class Spec:
    to: str
    old: str  # "from"
    cells: tuple[str, ...]
    steps: tuple[int, ...]  # percent of each cell's conversations, ending at 100
    step_seconds: float
    ready_timeout: float
    gates: GateSettings
    golden: tuple[GoldenItem, ...]
    golden_raw: tuple[Mapping[str, Any], ...]  # as asked, to be kept with the rollout
    hooks: tuple[str, ...]
    resume_across: bool
    reason: str

    @property
    def looks(self) -> int:
        """How many times the gates are judged at a step's end, over the whole rollout."""
        return len(self.cells) * len(self.steps)

    def wire(self) -> dict[str, Any]:
        """As the store keeps it (and `parse` reads it back, against the same fleet)."""
        return {
            "to": self.to,
            "from": self.old,
            "cells": list(self.cells),
            "steps": list(self.steps),
            "step_seconds": self.step_seconds,
            "ready_timeout": self.ready_timeout,
            "gates": dataclasses.asdict(self.gates),
            "golden": [dict(g) for g in self.golden_raw],
            "hooks": list(self.hooks),
            "resume_across": self.resume_across,
            "reason": self.reason,
        }


@dataclass(frozen=True, slots=True)
class Fleet:
    """What the spec is checked against: each cell's serving revision, the revisions units
    carry (by cell)."""

    serving: Mapping[str, str]
    carried: Mapping[str, frozenset[str]]  # cell -> revisions of its units


def parse(body: object, config: RolloutConfig, fleet: Fleet | None) -> Spec:
    """The ask, checked against the fleet as it is (None: a saved rollout's ask, read back
    after a restart: its cells and revisions were checked when it started)."""
    if not isinstance(body, Mapping):
        raise SpecError("body", "must be a JSON object")
    for key in body:
        if key not in FIELDS:
            raise SpecError(
                str(key), f"is not a rollout field (fields: {', '.join(sorted(FIELDS))})"
            )
    to = _label(body, "to", required=True)
    hooks = _hooks(body, config)
    if fleet is None:
        return _spec(body, config, to, _label(body, "from"), tuple(body["cells"]), hooks)
    old, cells = _cells(body, fleet, to)
    if not any(to in fleet.carried.get(cell, frozenset()) for cell in cells) and not any(
        "prepare" in config.hooks[h].when for h in hooks
    ):
        raise SpecError(
            "to",
            f"no unit carries revision {to!r} in cells {', '.join(cells)}, and no prepare hook "
            "is named to add any: add the new revision's units first (POST /admin/units)",
        )
    return _spec(body, config, to, old, cells, hooks)


def _spec(
    body: Mapping[str, Any],
    config: RolloutConfig,
    to: str,
    old: str,
    cells: tuple[str, ...],
    hooks: tuple[str, ...],
) -> Spec:
    golden_raw = body.get("golden", [])
    if not isinstance(golden_raw, list) or not all(isinstance(g, Mapping) for g in golden_raw):
        raise SpecError("golden", "must be a list of objects")
    resume_across = body.get("resume_across", True)
    if not isinstance(resume_across, bool):
        raise SpecError("resume_across", "must be true or false")
    reason = body.get("reason", "")
    if not isinstance(reason, str):
        raise SpecError("reason", "must be a string")
    return Spec(
        to=to,
        old=old,
        cells=cells,
        steps=_steps(body.get("steps", list(config.steps))),
        step_seconds=_seconds(body, "step_seconds", config.step_seconds),
        ready_timeout=_seconds(body, "ready_timeout", config.ready_timeout),
        gates=_gates(body.get("gates", {}), config),
        golden=tuple(_golden(golden_raw)),
        golden_raw=tuple(golden_raw),
        hooks=hooks,
        resume_across=resume_across,
        reason=reason,
    )


def _label(body: Mapping[str, Any], key: str, required: bool = False) -> str:
    if key not in body and not required:
        return ""
    value = body.get(key)
    if not isinstance(value, str) or len(value) > 128 or not value.isprintable():
        raise SpecError(key, "must be a revision label (a string of up to 128 characters)")
    return value


def _cells(body: Mapping[str, Any], fleet: Fleet, to: str) -> tuple[str, tuple[str, ...]]:
    """The revision replaced and the cells in order: by default every cell serving it."""
    raw = body.get("cells")
    if raw is not None:
        if not isinstance(raw, list) or not raw or not all(isinstance(c, str) for c in raw):
            raise SpecError("cells", "must be a non-empty list of cell names")
        if len(set(raw)) != len(raw):
            raise SpecError("cells", "names a cell twice")
        unknown = [c for c in raw if c not in fleet.serving]
        if unknown:
            raise SpecError("cells", f"no such cell: {', '.join(unknown)}")
    if "from" in body:
        old = _label(body, "from")
    else:
        named = raw if raw is not None else sorted(fleet.serving)
        found = sorted({fleet.serving[c] for c in named if fleet.serving[c] != to})
        if len(found) != 1:
            what = "none" if not found else ", ".join(repr(r) for r in found)
            raise SpecError("from", f"must be given: the cells serve {what} besides {to!r}")
        old = found[0]
    if old == to:
        raise SpecError("from", f"is the target revision {to!r} itself")
    cells = (
        tuple(raw)
        if raw is not None
        else tuple(c for c in sorted(fleet.serving) if fleet.serving[c] == old)
    )
    if not cells:
        raise SpecError("from", f"no cell serves revision {old!r}")
    wrong = [f"{c} ({fleet.serving[c]!r})" for c in cells if fleet.serving[c] != old]
    if wrong:
        raise SpecError("cells", f"do not serve revision {old!r}: {', '.join(wrong)}")
    return old, cells


def _steps(raw: object) -> tuple[int, ...]:
    if not isinstance(raw, list) or not raw:
        raise SpecError("steps", "must be a non-empty list of percentages")
    for value in raw:
        if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= 100:
            raise SpecError("steps", f"{value!r} is not a whole percentage in 1..100")
    if any(b <= a for a, b in pairwise(raw)):
        raise SpecError("steps", f"{raw} must increase step by step")
    if raw[-1] != 100:
        raise SpecError("steps", f"{raw} must end at 100 (the cell moved whole)")
    return tuple(raw)


def _seconds(body: Mapping[str, Any], key: str, default: float) -> float:
    value = body.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SpecError(key, "must be a number of seconds")
    if not math.isfinite(value) or value <= 0:
        raise SpecError(key, f"must be > 0, not {value}")
    return float(value)


def _gates(raw: object, config: RolloutConfig) -> GateSettings:
    base = GateSettings(**dataclasses.asdict(config.gates))
    if not isinstance(raw, Mapping):
        raise SpecError("gates", "must be an object of gate settings")
    known = {f.name: f for f in dataclasses.fields(GateSettings)}
    changes: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in known:
            raise SpecError(f"gates.{key}", f"is not a gate setting ({', '.join(sorted(known))})")
        default = getattr(base, key)
        if isinstance(default, int):
            ok = isinstance(value, int) and not isinstance(value, bool)
        else:
            ok = isinstance(value, int | float) and not isinstance(value, bool)
            ok = ok and math.isfinite(value)
        if not ok:
            raise SpecError(f"gates.{key}", f"must be a number like {default!r}, not {value!r}")
        changes[key] = value
    try:
        return dataclasses.replace(base, **changes)
    except ValueError as exc:
        raise SpecError("gates", str(exc)) from None


def _hooks(body: Mapping[str, Any], config: RolloutConfig) -> tuple[str, ...]:
    raw = body.get("hooks", [])
    if not isinstance(raw, list) or not all(isinstance(h, str) for h in raw):
        raise SpecError("hooks", "must be a list of hook names from [rollout.hooks]")
    unknown = [h for h in raw if h not in config.hooks]
    if unknown:
        known = ", ".join(sorted(config.hooks)) or "none"
        raise SpecError(
            "hooks", f"not defined in [rollout.hooks]: {', '.join(unknown)} (defined: {known})"
        )
    return tuple(raw)


def _golden(raw: Sequence[Mapping[str, Any]]) -> list[GoldenItem]:
    try:
        return parse_golden(list(raw))
    except GoldenError as exc:
        raise SpecError("golden", "; ".join(exc.problems), named=True) from None
