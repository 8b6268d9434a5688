"""Stop-string matching on decoded text.

Matching runs on text, not tokens, because one stop string can span several tokens and one
token can hold the end of a stop string plus more text.
"""

from __future__ import annotations

from collections.abc import Sequence


def find_stop(text: str, stops: Sequence[str], start: int = 0) -> tuple[int, str] | None:
    """The earliest match wins, so the visible text is the shortest prefix ending at any stop.

    Returns (index where the stop string starts, the stop string), or None. Matches starting
    before `start` are not looked for: the caller searched that text already.
    """
    best: tuple[int, str] | None = None
    for stop in stops:
        index = text.find(stop, start)
        if index >= 0 and (best is None or index < best[0]):
            best = (index, stop)
    return best


def partial_stop_len(text: str, stops: Sequence[str]) -> int:
    """How many trailing characters could still grow into a stop string.

    A streaming server must hold these back: once sent, text cannot be taken back if the next
    token completes the stop string.
    """
    longest = 0
    for stop in stops:
        for k in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:k]):
                longest = k
                break
    return longest
