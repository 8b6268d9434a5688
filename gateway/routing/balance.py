"""The balancing decision: to the unit predicted to answer soonest where every candidate's
latency is learned, else where the prompt's prefix is cached, else affinity (each bounded),
else power-of-two-choices."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from random import Random
from typing import Protocol, TypeVar

from gateway.routing.affinity import Hashed, pick_bounded
from gateway.routing.cached import Identified, pick_cached
from gateway.routing.forecast import Estimate
from gateway.routing.picker import has_room, pick_p2c
from gateway.routing.timely import pick_timely


class Unit(Hashed, Identified, Protocol):
    pass


H = TypeVar("H", bound=Unit)


def choose(
    routable: Sequence[H],
    exclude: Collection[H],
    key: int | None,
    factor: float,
    rng: Random,
    cached: Mapping[str, int] | None = None,
    estimates: Mapping[str, Estimate] | None = None,
    slo: float | None = None,
    *,
    prompt: int = 0,
    cached_factor: float | None = None,
) -> H | None:
    """A unit with room for one more request, or None when every candidate is full (`place`
    without saying how)."""
    return place(
        routable,
        exclude,
        key,
        factor,
        rng,
        cached,
        estimates,
        slo,
        prompt=prompt,
        cached_factor=cached_factor,
    )[0]


def place(
    routable: Sequence[H],
    exclude: Collection[H],
    key: int | None,
    factor: float,
    rng: Random,
    cached: Mapping[str, int] | None = None,
    estimates: Mapping[str, Estimate] | None = None,
    slo: float | None = None,
    *,
    prompt: int = 0,
    cached_factor: float | None = None,
) -> tuple[H | None, str]:
    """A unit with room for one more request (None when every candidate is full), and how it
    was chosen: "predicted", "cached", "affinity" or "load".

    `exclude` holds units already tried for this request: a retry must go elsewhere.
    `cached`: how many of the prompt's `prompt` tokens each unit's cache holds (cached.py,
    whose bound loosens towards `cached_factor` by that share).
    `estimates`: each unit's predicted latency for this request, `slo` its class's TTFT
    target (timely.py).
    """
    candidates = [u for u in routable if u not in exclude] if exclude else routable
    if estimates:
        unit = pick_timely(estimates, candidates, factor, slo)
        if unit is not None:
            return unit, "predicted"
    if cached:
        unit = pick_cached(cached, candidates, factor, prompt, cached_factor)
        if unit is not None:
            return unit, "cached"
    if key is not None:
        unit = pick_bounded(key, candidates, factor)
        if unit is not None:
            return unit, "affinity"
    return pick_p2c([u for u in candidates if has_room(u)], rng), "load"
