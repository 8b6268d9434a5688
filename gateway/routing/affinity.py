"""Affinity keys mapped to units by weighted rendezvous hashing with bounded load.

Rendezvous (highest random weight) hashing keeps a key on the same unit while the set of units
is stable and moves only the keys of a unit that leaves. The load bound (Mirrokni et al.,
"consistent hashing with bounded loads") lets a key overflow to its next-ranked unit once its
first choice carries more than `factor` times its weighted fair share, so one hot session or
shared prompt prefix cannot overload a unit.

The bound counts this gateway's own requests only, not the others' its leaders report
(`gateway/routing/load.py`): those are read once a probe round and can hold a request that
has just ended, so a key sent one request after another would seem to overflow and move
between units, and workers holding different such estimates would send one key to different
units. Keyless requests, which p2c places on the whole load, fill in around the keys.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from hashlib import blake2b
from typing import Protocol, TypeVar

from gateway.routing.picker import Loaded, first_within_bound

_MASK = (1 << 64) - 1


class Hashed(Loaded, Protocol):
    @property
    def key_hash(self) -> int: ...


H = TypeVar("H", bound=Hashed)


def hash_key(key: str) -> int:
    """A stable 64-bit hash (Python's `hash` is salted per process)."""
    return int.from_bytes(
        blake2b(key.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little"
    )


def affinity_key(mode: str, session: str | None, prefix: str) -> int | None:
    """The request's affinity key under `mode` (see RoutingConfig.affinity); session wins."""
    if session and "session" in mode:
        return hash_key("s:" + session)
    if prefix and "prefix" in mode:
        return hash_key("p:" + prefix)
    return None


def _mix(x: int) -> int:
    # splitmix64 finaliser: cheap, and turns key^unit into a uniform 64-bit value.
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 & _MASK
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB & _MASK
    return x ^ (x >> 31)


def rendezvous_score(key: int, unit_key: int, weight: float) -> float:
    """Weighted HRW score: -w / ln(u), u uniform in (0, 1)."""
    u = (_mix(key ^ unit_key) + 1) / (_MASK + 2)
    return -weight / math.log(u)


def rank(key: int, units: Sequence[H]) -> list[H]:
    return sorted(units, key=lambda u: rendezvous_score(key, u.key_hash, u.weight), reverse=True)


def pick_bounded(key: int, units: Sequence[H], factor: float) -> H | None:
    """The highest-ranked unit with room whose load stays within the bound, else None.

    `units` are the eligible units; the bound uses their total in-flight plus this request.
    """
    if not units:
        return None
    return first_within_bound(rank(key, units), units, factor)
