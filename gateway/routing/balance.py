"""The balancing decision: affinity first (bounded), else power-of-two-choices."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from random import Random
from typing import TypeVar

from gateway.routing.affinity import Hashed, pick_bounded
from gateway.routing.picker import has_room, pick_p2c

H = TypeVar("H", bound=Hashed)


def choose(
    routable: Sequence[H],
    exclude: Collection[H],
    key: int | None,
    factor: float,
    rng: Random,
) -> H | None:
    """A unit with room for one more request, or None when every candidate is full.

    `exclude` holds units already tried for this request: a retry must go elsewhere.
    """
    candidates = [u for u in routable if u not in exclude] if exclude else routable
    if key is not None:
        unit = pick_bounded(key, candidates, factor)
        if unit is not None:
            return unit
    return pick_p2c([u for u in candidates if has_room(u)], rng)
