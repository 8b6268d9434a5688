"""The x-ratelimit-* headers (OpenAI's names and duration format) and Retry-After.

`reset` is a duration in Go's notation, as OpenAI writes it: "20ms" below a second, else whole
seconds rounded up ("1s", "59s", "6m0s", "1h2m3s"; read from a table: the headers go on every
answer). Retry-After is whole seconds, at least 1.
"""

from __future__ import annotations

import math


def _go(seconds: int) -> str:
    minutes, secs = divmod(seconds, 60)
    if minutes == 0:
        return f"{secs}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes}m{secs}s" if hours else f"{minutes}m{secs}s"


_TABLE = tuple(_go(s) for s in range(2 * 3600))


def duration(seconds: float) -> str:
    if seconds < 1.0:
        millis = math.ceil(seconds * 1000) if seconds > 0 else 0
        return f"{millis}ms" if millis else "0s"
    whole = math.ceil(seconds - 1e-9)
    return _TABLE[whole] if whole < len(_TABLE) else _go(whole)


def retry_after(seconds: float) -> int:
    return max(1, math.ceil(seconds - 1e-9))


def rate_headers(
    requests: tuple[int, int, float] | None, tokens: tuple[int, int, float] | None
) -> dict[str, str]:
    """The six headers from (limit, remaining, reset in seconds) of each limit that is set."""
    headers: dict[str, str] = {}
    if requests is not None:
        limit, remaining, reset = requests
        headers["x-ratelimit-limit-requests"] = str(limit)
        headers["x-ratelimit-remaining-requests"] = str(remaining if remaining > 0 else 0)
        headers["x-ratelimit-reset-requests"] = duration(reset)
    if tokens is not None:
        limit, remaining, reset = tokens
        headers["x-ratelimit-limit-tokens"] = str(limit)
        headers["x-ratelimit-remaining-tokens"] = str(remaining if remaining > 0 else 0)
        headers["x-ratelimit-reset-tokens"] = duration(reset)
    return headers
