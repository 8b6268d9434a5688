"""To the unit predicted to answer soonest (forecast.py), within the load bound.

Each candidate carries an Estimate: its predicted time to first token for this request (its
uncached prompt tokens, the prefill queued ahead, its running requests) and that plus its
decode load (`cost`). The least cost wins. A class's TTFT target (`slo`) comes first: units
predicted to meet it are ranked by cost ahead of every unit predicted to miss it, which are
ranked by their predicted TTFT (when all miss, the soonest first token).

The same load bound as affinity and the cache scorer (picker.first_within_bound) stays the
guard against hot spots: a forecast is wrong in the same direction for every request placed
between two observations, and a long prefix every request shares must not pile onto the one
unit that holds it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeVar

from gateway.routing.cached import Identified
from gateway.routing.forecast import Estimate
from gateway.routing.picker import first_within_bound, weighted_load

C = TypeVar("C", bound=Identified)


def pick_timely(
    estimates: Mapping[str, Estimate], units: Sequence[C], factor: float, slo: float | None
) -> C | None:
    """Of `units` (the candidates), the best by the rule above that has room and stays within
    the load bound; None when none does (or none has an estimate)."""

    def rank(unit: C) -> tuple[bool, float, float]:
        e = estimates[unit.id]
        missed = slo is not None and e.ttft > slo
        return missed, e.ttft if missed else e.cost, weighted_load(unit)

    ranked = [u for u in units if u.id in estimates]
    if not ranked:
        return None
    best = min(ranked, key=rank)  # most often within the bound: no sort
    return first_within_bound((best,), units, factor) or first_within_bound(
        sorted(ranked, key=rank), units, factor
    )
