"""Comparing a count with a share of a total, which is a float: 0.5 * 4 must still mean 2 and
0.57 * 100 must still allow 57 (it is 56.99999999999999). One tolerance, for every policy
that caps or floors by a share (the breakers' ejection cap, panic routing's threshold)."""

from __future__ import annotations

_EPSILON = 1e-9


def below_share(count: int, share: float, total: int) -> bool:
    """`count < share * total`, with `count == share * total` (as a float) not below."""
    return count < share * total - _EPSILON


def above_share(count: int, share: float, total: int) -> bool:
    """`count > share * total`, with `count == share * total` (as a float) not above."""
    return count > share * total + _EPSILON
