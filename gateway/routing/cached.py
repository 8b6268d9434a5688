"""To the unit whose KV cache already holds the most of a prompt's prefix, from its engine's
own events (gateway/kvevents): `depths` maps a unit's id to how many of the prompt's leading
tokens its cache holds (whole blocks of its own size).

The same load bound as affinity (affinity.py) keeps one long prefix that every request shares
from piling onto the one unit that cached it first: a unit past `factor` times its weighted
fair share is passed over for the next-deepest, and when every unit holding the prefix is
past it, the caller places the request as if nothing were cached (the prefix is then cached
on a second unit, which takes its share from there on).

The bound is looser for a unit that holds more of the prompt: its cache is known (the KV
events), and a hit saves the prefill a miss would pay on another unit, then evicts other
prefixes there to cache this one again. With `cached_factor` and the prompt's tokens known, a
unit holding a share s of the prompt is bounded by `factor + (cached_factor - factor) x s`
times its fair share: a wholly cached prompt by `cached_factor`, a prompt that shares a block
or two by about `factor`. (Four requests at a time over two units, say: at 1.25x a unit takes
at most three of the four, so a request whose holder runs the other three, one in eight, would
be prefilled again on the other unit.)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol, TypeVar

from gateway.routing.picker import Loaded, first_within_bound, weighted_load


class Identified(Loaded, Protocol):
    @property
    def id(self) -> str: ...


C = TypeVar("C", bound=Identified)


def pick_cached(
    depths: Mapping[str, int],
    units: Sequence[C],
    factor: float,
    prompt: int = 0,
    cached_factor: float | None = None,
) -> C | None:
    """Of `units` (the candidates), the one holding the most leading tokens that has room and
    stays within its load bound (`factor`, loosened towards `cached_factor` by the share of
    the `prompt` tokens it holds, when both are given); among equal depths the least loaded
    (then the first). None when no candidate holds a block, or none that does may take one
    more request."""
    holding = [u for u in units if depths.get(u.id, 0) > 0]
    if not holding:
        return None
    holding.sort(key=lambda u: (-depths[u.id], weighted_load(u)))
    if cached_factor is None or cached_factor <= factor or prompt <= 0:
        return first_within_bound(holding, units, factor)

    def loosened(unit: C) -> float:
        return factor + (cached_factor - factor) * min(1.0, depths[unit.id] / prompt)

    return first_within_bound(holding, units, factor, loosened)
