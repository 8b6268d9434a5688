"""Power-of-two-choices over the ready units, by weighted outstanding requests (this
gateway's own, plus the others' the leader last reported: `gateway/routing/load.py`).

Two random candidates and the lighter one wins: nearly as good as least-loaded, without the
herding that a global minimum causes when many requests arrive between load updates.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from random import Random
from typing import Protocol, TypeVar


class Loaded(Protocol):
    """What the picker needs to know about a unit."""

    @property
    def inflight(self) -> int: ...

    @property
    def foreign(self) -> int: ...

    @property
    def weight(self) -> float: ...

    @property
    def cap(self) -> int: ...


U = TypeVar("U", bound=Loaded)


def has_room(unit: Loaded) -> bool:
    return unit.inflight < unit.cap


def weighted_load(unit: Loaded) -> float:
    """Its requests in flight, the gateway's and others' (`foreign`), per unit of weight. +1
    counts the request being placed, so an idle heavy unit still beats an idle light one."""
    return (unit.inflight + unit.foreign + 1) / unit.weight


def first_within_bound(
    ordered: Iterable[U],
    units: Sequence[Loaded],
    factor: float,
    factors: Callable[[U], float] | None = None,
) -> U | None:
    """The first of `ordered` with room whose requests in flight, this one counted, stay within
    `factor` (or its own, `factors(unit)`) times its weighted fair share of all `units`' plus
    this one (bounded load)."""
    total_inflight = sum(u.inflight for u in units) + 1
    total_weight = sum(u.weight for u in units)
    for unit in ordered:
        f = factor if factors is None else factors(unit)
        bound = math.ceil(f * total_inflight * unit.weight / total_weight)
        if unit.inflight + 1 <= bound and has_room(unit):
            return unit
    return None


def pick_p2c(ready: Sequence[U], rng: Random) -> U | None:
    """Pick from units that all have room; None when there are none."""
    n = len(ready)
    if n == 0:
        return None
    if n == 1:
        return ready[0]
    # random() rather than randrange(): one C call each, where randrange is three of Python.
    i = int(rng.random() * n)
    j = int(rng.random() * (n - 1))
    if j >= i:
        j += 1
    a, b = ready[i], ready[j]
    return a if weighted_load(a) <= weighted_load(b) else b
