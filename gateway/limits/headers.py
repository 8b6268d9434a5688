"""The x-ratelimit-* headers (OpenAI's names and duration format) and Retry-After.

`reset` is a duration in Go's notation, as OpenAI writes it: "20ms", "1s", "1.5s", "6m0s",
"1h2m3s". Retry-After is whole seconds, at least 1.
"""

from __future__ import annotations

import math


def duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 1.0:
        millis = round(seconds * 1000)
        return f"{millis}ms" if millis else "0s"
    if seconds < 60.0:
        return f"{round(seconds, 3):g}s"
    hours, rest = divmod(seconds, 3600.0)
    minutes, secs = divmod(rest, 60.0)
    text = f"{round(secs, 3):g}s"
    if hours:
        return f"{int(hours)}h{int(minutes)}m{text}"
    if minutes:
        return f"{int(minutes)}m{text}"
    return text


def retry_after(seconds: float) -> int:
    return max(1, math.ceil(seconds - 1e-9))


def rate_headers(
    requests: tuple[int, int, float] | None, tokens: tuple[int, int, float] | None
) -> dict[str, str]:
    """The six headers from (limit, remaining, reset in seconds) of each limit that is set."""
    headers: dict[str, str] = {}
    for name, values in (("requests", requests), ("tokens", tokens)):
        if values is not None:
            limit, remaining, reset = values
            headers[f"x-ratelimit-limit-{name}"] = str(limit)
            headers[f"x-ratelimit-remaining-{name}"] = str(max(0, remaining))
            headers[f"x-ratelimit-reset-{name}"] = duration(reset)
    return headers
