"""Each unit's recent traffic for the status page's charts, read from the gateway's metrics.

Read when the status feed builds a snapshot (only while a page watches, at most every
READ_EVERY_S), never on the request path: the request and token counters and the TTFT
histogram, summed by unit over whatever other labels they carry (in a control plane, the
workers' sums too: observability/fleet.py). A short history of these cumulative readings gives
rates and TTFT quantiles over the last WINDOW_S, the way Prometheus' `rate()` and
`histogram_quantile()` would over the same samples.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from gateway.observability.metrics import Metrics

WINDOW_S = 5.0  # rates and quantiles over about this long
READ_EVERY_S = 0.5  # snapshots come up to 10 a second; the metrics are read at most this often
Sample = tuple[str, dict[str, str], float]  # (sample name, labels, value)
Rates = dict[str, dict[str, float | None]]  # per unit: what the charts draw


@dataclass(slots=True)
class Reading:
    """One unit's cumulative counts at one moment."""

    requests: float = 0.0
    errors: float = 0.0  # answered with a 5xx
    prompt: float = 0.0
    completion: float = 0.0
    ttft: dict[float, float] = field(default_factory=dict)  # bucket bound -> cumulative count


def readings(
    samples: Iterable[Sample], requests: str, tokens: str, ttft: str
) -> dict[str, Reading]:
    """Per unit, from the samples of the three families (named without a suffix)."""
    out: dict[str, Reading] = {}
    for name, labels, value in samples:
        unit = labels.get("unit")
        if unit is None or unit == "none":  # refused before any unit was picked
            continue
        r = out.get(unit)
        if r is None:
            r = out[unit] = Reading()
        if name == requests + "_total":
            r.requests += value
            if labels.get("status", "").startswith("5"):
                r.errors += value
        elif name == tokens + "_total":
            if labels.get("type") == "completion":
                r.completion += value
            elif labels.get("type") == "prompt":
                r.prompt += value
        elif name == ttft + "_bucket":
            bound = float(labels.get("le", "+Inf"))
            r.ttft[bound] = r.ttft.get(bound, 0.0) + value
    return out


def quantile(q: float, cumulative: dict[float, float]) -> float | None:
    """The q-quantile of a histogram's cumulative bucket counts, interpolated within its
    bucket (as `histogram_quantile` does); None without observations."""
    ordered = sorted(cumulative.items())
    total = ordered[-1][1] if ordered else 0.0
    if total <= 0:
        return None
    rank, lower, below = q * total, 0.0, 0.0
    for bound, count in ordered:
        if count >= rank and count > below:
            if math.isinf(bound):
                return lower  # beyond the last finite bound: that bound is all we know
            return lower + (bound - lower) * (rank - below) / (count - below)
        lower, below = bound, count
    return lower


class Window:
    """Rates over the last `window_s` from cumulative readings (pure: the clock is passed)."""

    def __init__(self, window_s: float = WINDOW_S) -> None:
        self.window_s = window_s
        self._history: deque[tuple[float, dict[str, Reading]]] = deque()

    def update(self, now: float, current: dict[str, Reading]) -> Rates | None:
        """Each unit's rates since the oldest reading kept (None until there is one)."""
        history = self._history
        history.append((now, current))
        while len(history) > 2 and now - history[1][0] >= self.window_s:
            history.popleft()
        since, base = history[0]
        elapsed = now - since
        if elapsed <= 0:
            return None
        return {unit: _rates(r, base.get(unit), elapsed) for unit, r in current.items()}


def _rates(now: Reading, then: Reading | None, elapsed: float) -> dict[str, float | None]:
    then = then or Reading()

    def per_s(a: float, b: float) -> float:
        return max(0.0, a - b) / elapsed  # never negative, should a count restart

    ttft = {b: max(0.0, n - then.ttft.get(b, 0.0)) for b, n in now.ttft.items()}
    return {
        "rps": per_s(now.requests, then.requests),
        "errors_per_s": per_s(now.errors, then.errors),
        "tokens_per_s": per_s(now.completion, then.completion),
        "prompt_tokens_per_s": per_s(now.prompt, then.prompt),
        "ttft_p50": quantile(0.5, ttft),
        "ttft_p99": quantile(0.99, ttft),
    }


class Traffic:
    """What the feed asks for: each unit's rates, added to its view in a snapshot."""

    def __init__(self, metrics: Metrics, clock: Callable[[], float] = time.monotonic) -> None:
        self._metrics, self._clock = metrics, clock
        self._names = (_name(metrics.requests.collect()), _name(metrics.tokens.collect()))
        self._window = Window()
        self._last: tuple[float, Rates | None] | None = None

    def annotate(self, snapshot: dict[str, Any]) -> None:
        """Set `traffic` on each unit of the snapshot (absent until a window exists)."""
        now = self._clock()
        if self._last is None or now - self._last[0] >= READ_EVERY_S:
            self._last = (now, self._window.update(now, self._read()))
        rates = self._last[1]
        if rates is None:
            return
        snapshot["traffic_window_s"] = self._window.window_s
        for unit in snapshot.get("units", ()):
            unit["traffic"] = rates.get(unit["id"]) or dict(_IDLE)

    def _read(self) -> dict[str, Reading]:
        m = self._metrics
        names = (*self._names, m.ttft.name)
        samples: list[Sample] = [
            (s.name, s.labels, s.value)
            for each in (m.requests, m.tokens, m.ttft)
            for family in each.collect()
            for s in family.samples
        ]
        if m.fleet is not None:  # a control plane: the workers count the requests
            samples += [
                (name, dict(labels), value)
                for (family, name, labels), value in m.fleet.totals().items()
                if family in names
            ]
        return readings(samples, *names)


_IDLE: dict[str, float | None] = {
    "rps": 0.0,
    "errors_per_s": 0.0,
    "tokens_per_s": 0.0,
    "prompt_tokens_per_s": 0.0,
    "ttft_p50": None,
    "ttft_p99": None,
}


def _name(families: Iterable[Any]) -> str:
    return str(next(iter(families)).name)
