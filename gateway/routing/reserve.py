"""Reserved capacity: the slots a more important class holds back from the less important ones.

The rule. With `capacity` slots in all and `used[c]` of them held by class c, class k may
take one more slot when, after taking it, the free slots still cover what the classes more
important than k have reserved and are not using:

    capacity - sum(used) - 1  >=  sum over classes h ranked above k of
                                   max(0, reserved(h) - used[h])
    where reserved(h) = floor(h.reserved_share * capacity)

A class is never held back by its own reservation or by a less important one's, so the most
important class may take every free slot. A class that already uses at least its reservation
holds nothing back. Reservations are whole slots rounded down: the shares sum to less than 1
(config/priority.py), so the least important class can always run one request on an idle
gateway, however small.

The rule is monotone in rank: a class that may not take a slot leaves every less important
class unable to take it too (each is held back by a superset), which is what lets the queues
stop looking at the first class that does not fit.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from gateway.config.priority import PriorityClass


def reserved(share: float, capacity: int) -> int:
    """Whole slots of `capacity` a share reserves (1e-9 absorbs 0.1 * 30 = 3.0000000000000004)."""
    return math.floor(share * capacity + 1e-9)


def held_back(
    ranked: Sequence[PriorityClass], name: str, capacity: int, used: Mapping[str, int]
) -> int:
    """Slots the classes ranked above `name` (in `ranked`, most important first) hold back."""
    held = 0
    for c in ranked:
        if c.name == name:
            return held
        held += max(0, reserved(c.reserved_share, capacity) - used.get(c.name, 0))
    raise KeyError(name)


def fits(
    ranked: Sequence[PriorityClass], name: str, capacity: int, used: Mapping[str, int]
) -> bool:
    """Whether class `name` may take one more of `capacity` slots, `used` held by class."""
    free_after = capacity - sum(used.values()) - 1
    return free_after >= 0 and free_after >= held_back(ranked, name, capacity, used)
