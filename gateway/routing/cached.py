"""To the unit whose KV cache already holds the most of a prompt's prefix, from its engine's
own events (gateway/kvevents): `depths` maps a unit's id to how many of the prompt's leading
tokens its cache holds (whole blocks of its own size).

The same load bound as affinity (affinity.py) keeps one long prefix that every request shares
from piling onto the one unit that cached it first: a unit past `factor` times its weighted
fair share is passed over for the next-deepest, and when every unit holding the prefix is
past it, the caller places the request as if nothing were cached (the prefix is then cached
on a second unit, which takes its share from there on).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol, TypeVar

from gateway.routing.picker import Loaded, first_within_bound, weighted_load


class Identified(Loaded, Protocol):
    @property
    def id(self) -> str: ...


C = TypeVar("C", bound=Identified)


def pick_cached(depths: Mapping[str, int], units: Sequence[C], factor: float) -> C | None:
    """Of `units` (the candidates), the one holding the most leading tokens that has room and
    stays within the load bound; among equal depths the least loaded (then the first). None
    when no candidate holds a block, or none that does may take one more request."""
    holding = [u for u in units if depths.get(u.id, 0) > 0]
    if not holding:
        return None
    holding.sort(key=lambda u: (-depths[u.id], weighted_load(u)))
    return first_within_bound(holding, units, factor)
