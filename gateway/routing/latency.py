"""How long each unit will take to answer, learned online from what the gateway observes: its
time to first token against the prompt tokens it had to compute (those its cache did not
hold) and the prefill work queued ahead, and its time per output token against the requests
it was running. Pure and synchronous: the request path feeds observations, routing asks for
predictions; O(1) each, no sidecar.

Each unit's figures are fitted by recursive least squares with a forgetting factor: an
observation's weight halves every ln(2) / (1 - forget) observations (70 with the default
0.99), so a unit whose speed changes (a lagging node, a noisy neighbour, a new revision) is
relearned within a few hundred requests, and units of different speeds get different
coefficients without configuration.

Token counts enter in thousands, so that the coefficients are seconds per thousand tokens
and the fit stays well conditioned. A direction the observations never excite (every prompt
the same length) would let the estimator's covariance grow without bound under forgetting:
it is capped (`MAX_VARIANCE`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence

MAX_VARIANCE = 1e6
PRIOR_VARIANCE = 1e3


class Rls:
    """y ~ theta . x, fitted by recursive least squares with exponential forgetting."""

    __slots__ = ("forget", "p", "samples", "theta")

    def __init__(self, n: int, forget: float = 0.99) -> None:
        if not 0.5 < forget <= 1.0:
            raise ValueError(f"forget must be in (0.5, 1], not {forget!r}")
        self.forget = forget
        self.theta = [0.0] * n
        self.p = [[PRIOR_VARIANCE if i == j else 0.0 for j in range(n)] for i in range(n)]
        self.samples = 0

    def predict(self, x: Sequence[float]) -> float:
        return sum(t * v for t, v in zip(self.theta, x, strict=True))

    def update(self, x: Sequence[float], y: float) -> None:
        if not math.isfinite(y) or not all(math.isfinite(v) for v in x):
            return
        n, p, lam = len(self.theta), self.p, self.forget
        px = [sum(p[i][j] * x[j] for j in range(n)) for i in range(n)]
        denominator = lam + sum(x[i] * px[i] for i in range(n))
        gain = [v / denominator for v in px]
        error = y - self.predict(x)
        self.theta = [t + g * error for t, g in zip(self.theta, gain, strict=True)]
        for i in range(n):
            for j in range(n):
                p[i][j] = (p[i][j] - gain[i] * px[j]) / lam
        for i in range(n):
            if p[i][i] > MAX_VARIANCE:  # an unexcited direction: hold its uncertainty there
                scale = math.sqrt(MAX_VARIANCE / p[i][i])
                for j in range(n):
                    p[i][j] *= scale
                    p[j][i] *= scale
        self.samples += 1


class UnitLatency:
    """One unit's learned time to first token and time per output token."""

    __slots__ = ("least", "tpot", "ttft")

    def __init__(self, forget: float = 0.99, least: int = 20) -> None:
        # ttft = a + b * uncached_k + c * queued_k;  tpot = d + e * running
        self.ttft = Rls(3, forget)
        self.tpot = Rls(2, forget)
        self.least = least  # observations before a prediction is trusted

    def first_token(self, uncached: int, queued: int, seconds: float) -> None:
        """A request's first token came `seconds` after it was sent, with `uncached` prompt
        tokens to compute and `queued` prompt tokens of other requests ahead of it."""
        self.ttft.update((1.0, uncached / 1000, queued / 1000), seconds)

    def token_gap(self, running: int, seconds: float) -> None:
        """A stream's mean time per output token while the unit ran `running` requests."""
        self.tpot.update((1.0, float(running)), seconds)

    def predict_ttft(self, uncached: int, queued: int) -> float | None:
        if self.ttft.samples < self.least:
            return None
        return max(0.0, self.ttft.predict((1.0, uncached / 1000, queued / 1000)))

    def predict_tpot(self, running: int) -> float | None:
        if self.tpot.samples < self.least:
            return None
        return max(0.0, self.tpot.predict((1.0, float(running))))

    @property
    def prefill_per_ktoken(self) -> float | None:
        """Seconds of prefill per thousand uncached prompt tokens, once learned."""
        return self.ttft.theta[1] if self.ttft.samples >= self.least else None


def slow_prefill(units: Mapping[str, UnitLatency], factor: float = 2.0) -> dict[str, float]:
    """The units whose prefill per token is more than `factor` times the fleet's median (of
    the units that have learned theirs; at least three, so that one slow unit of two is not
    the median's half): each with its ratio to the median."""
    learned = {u: f for u, m in units.items() if (f := m.prefill_per_ktoken) is not None}
    if len(learned) < 3:
        return {}
    median = statistics.median(learned.values())
    if median <= 0:
        return {}
    return {u: f / median for u, f in learned.items() if f > factor * median}
