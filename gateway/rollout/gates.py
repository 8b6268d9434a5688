"""Gates: whether a new revision's answers are worse than the old one's, with a known chance
of rolling back a revision that is not.

A rollout looks at its gates at the end of every step of every cell: K = cells x steps looks,
known when it starts. At each look, `TESTS` statistical tests are judged (the error rate, the
break rate, the medians and the tails of time to first token and of time per output token,
the finish reasons). Any one failing rolls the rollout back, so a look's significance is the
rollout's `alpha` split over its looks, and then over its tests: by the union bound, the
chance that an identical revision fails anywhere is at most `alpha`, whether the looks judge
separate windows or overlapping ones, and whatever the tests' correlation.

The split over looks is even (alpha / K, Bonferroni). An O'Brien-Fleming-like spending keeps
the early looks almost unable to fail (for 2 cells of 4 steps, it spends 0.56% of a 5% alpha
over the whole first cell) to keep power for the last ones; but a cell-by-cell rollout is
there to stop a bad revision in its first cell, while it serves a small share, not in its
last, when it serves nearly everyone. The exact group-sequential boundaries, less
conservative when the looks judge accumulating data, need that data's information fractions
and a multivariate normal integral; not worth it for tests whose typical failure is far past
any boundary.

Each test also needs an effect, not only significance: an error or break rate more than a
margin above the old one, a median at least `latency_min_effect` slower, a tail more than
`p99_ratio` slower, a share of truncated ("length") answers moved by more than
`finish_shift`. With a lot of traffic, significance alone would roll back differences no
one notices.

A tail is not compared raw: a p99 of a step's few hundred samples is little more than their
largest two or three, and two identical revisions' differ by more than `p99_ratio` (1.5) in
one look of nine with 50 samples each (lognormal, sigma 0.5), one of ninety with 200, where
a test may spend less than 0.001. New's p99 above `p99_ratio` x old's means more than 1% of
new's samples above that limit; the tail fails when new's p99 is above it and that share is
significantly above 1% (a binomial tail at the look's alpha).

The hard guards (`guards`) are another matter: judged every second on running totals, they
are there to stop a revision that fails outright within seconds, not to see 1% differences.
Each of their looks tests at `guard_alpha` (0.001): far more than 1,200 looks x 0.001 would
allow if the looks were independent, but they are not. Running totals a second apart are
nearly the same totals, and a statistic watched continuously from t0 to T crosses a normal
boundary c with probability about 1 - Φ(c) + φ(c) c/2 ln(T / t0) (Siegmund): for c = 3.09 and
a first look with a few errors to a last one 1,200 times later, about 4%, and that for a
revision exactly the margin worse than the old one. Simulated (tests/gateway/rollout: 2 cells
of 4 steps, 100 to 300 requests of each revision a step, the guards every thirtieth of a step
on the cell's totals), 2% errors against 1% are rolled back by the guards in 3.8% of
rollouts. The guards' chance is not part of `alpha`, but adds to it: an identical revision
is rolled back in 0.8% of rollouts, guards and gates together (the two median tests spend
their share of alpha nearly in full, the others, a margin from their boundary, hardly any).
A guard also needs `GUARD_MIN_EVENTS` events of the new revision, so that two unlucky errors
in its first few answers are not a rollback.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal, NamedTuple

from gateway.rollout.samples import Histogram, Window

Outcome = Literal["pass", "fail", "wait"]

TESTS = 7  # per look: errors, breaks, ttft median and tail, tpot median and tail, finish
TAIL = 0.99  # the tail gates compare p99s
GUARD_MIN_EVENTS = 3  # errors or breaks of the new revision before a guard may fail
_TAIL_PRECISION = 1e-17  # a binomial tail's terms are summed until this small a share


class Verdict(NamedTuple):
    """One gate's outcome, with why."""

    gate: str
    outcome: Outcome
    figures: dict[str, float | int]  # the numbers behind the outcome
    reason: str  # one plain sentence naming them


@dataclass(frozen=True, slots=True)
class GateSettings:
    """How sure the gates must be, and of how large a difference, to roll a revision back."""

    min_samples: int = 50  # per revision per gate: a gate waits until both have this many
    alpha: float = 0.05  # chance of rolling back an identical revision, over a whole rollout
    max_error_excess: float = 0.01  # error rate of new above old's that is tolerated
    latency_min_effect: float = 0.10  # a slower median fails only if this much slower
    p99_ratio: float = 1.5  # new p99 / old p99 above this fails (if significant)
    max_break_excess: float = 0.01  # break rate of new above old's that is tolerated
    finish_shift: float = 0.10  # change of the share of "length" finishes that is tolerated
    guard_alpha: float = 0.001  # significance of each look of a hard guard

    def __post_init__(self) -> None:
        if self.min_samples < 1:
            raise ValueError(f"min_samples must be at least 1, not {self.min_samples!r}")
        if not self.p99_ratio >= 1:
            raise ValueError(f"p99_ratio must be at least 1, not {self.p99_ratio!r}")
        for name in ("alpha", "guard_alpha"):
            if not 0 < getattr(self, name) < 1:
                raise ValueError(f"{name} must be in (0, 1), not {getattr(self, name)!r}")
        for name in ("max_error_excess", "latency_min_effect", "max_break_excess", "finish_shift"):
            if not 0 <= getattr(self, name) < 1:
                raise ValueError(f"{name} must be in [0, 1), not {getattr(self, name)!r}")


def alpha_for_look(alpha: float, look: int, looks: int) -> float:
    """The significance of all of look `look`'s tests together (1 <= look <= looks), so that
    a rollout of `looks` looks rolls an identical revision back with at most `alpha`."""
    if not 1 <= look <= looks:
        raise ValueError(f"look {look} of {looks}: looks count from 1")
    return alpha / looks


def mann_whitney_greater(new: Histogram, old: Histogram) -> float:
    """One-sided p-value that new's samples are stochastically greater (slower) than old's:
    the Mann-Whitney U test, samples in one bucket tied, by its normal approximation with
    the tie and continuity corrections. 1.0 when either is empty or all samples tie."""
    n1, n2 = new.count, old.count
    if not n1 or not n2:
        return 1.0
    u = 0.0  # pairs where new is slower, ties counting half
    ties = 0  # the sum of t^3 - t over buckets of t samples
    old_below = 0
    for i in sorted(new.counts.keys() | old.counts.keys()):
        a, b = new.counts.get(i, 0), old.counts.get(i, 0)
        u += a * (old_below + b / 2)
        old_below += b
        ties += (a + b) ** 3 - (a + b)
    n = n1 + n2
    variance = n1 * n2 / 12 * ((n + 1) - ties / (n * (n - 1)))
    if variance <= 0:
        return 1.0
    z = (u - n1 * n2 / 2 - 0.5) / math.sqrt(variance)
    return 0.5 * math.erfc(z / math.sqrt(2))


def binomial_excess(x_new: int, n_new: int, x_old: int, n_old: int, margin: float) -> float:
    """One-sided p-value against "new's rate is at most old's plus `margin`": the chance of
    `x_new` or more events in `n_new` trials at old's rate plus the margin.

    Old's rate is estimated as (x_old + 1/2) / (n_old + 1): its observed rate once it has a
    few hundred answers, but never 0 on a handful (20 answers without an error are no proof
    of a 0% error rate) and 1/2 on none, so that without old answers only a revision failing
    most of its requests fails. The tail is exact (see `binomial_tail`)."""
    if n_new <= 0:
        return 1.0
    rate = min(1.0, (x_old + 0.5) / (max(n_old, 0) + 1) + margin)
    return binomial_tail(x_new, n_new, rate)


def binomial_tail(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p), exactly: one term by lgamma, the others by the
    ratio of neighbours, summed away from the mode until they no longer count, so about
    √(n p (1 - p)) terms and no overflow for any n. The smaller side of the mode is summed:
    the upper tail itself above it, one minus the lower tail below."""
    if k <= 0 or p >= 1:
        return 1.0 if k <= n else 0.0
    if k > n or p <= 0:
        return 0.0
    mode = math.floor((n + 1) * p)
    upper = k > mode
    j = k if upper else k - 1
    term = math.exp(
        math.lgamma(n + 1)
        - math.lgamma(j + 1)
        - math.lgamma(n - j + 1)
        + j * math.log(p)
        + (n - j) * math.log1p(-p)
    )
    odds, total = p / (1 - p), 0.0
    while term > total * _TAIL_PRECISION and 0 <= j <= n:
        total += term
        if upper:
            term *= (n - j) / (j + 1) * odds
            j += 1
        else:
            term *= j / (n - j + 1) / odds
            j -= 1
    return min(1.0, total) if upper else max(0.0, 1.0 - total)


def guards(new: Window, old: Window, s: GateSettings) -> list[Verdict]:
    """The hard guards, judged every second on running totals (those since the cell began,
    say): errors and breaks. They pass or fail, never wait: a guard fails once new has
    `GUARD_MIN_EVENTS` events and a rate above old's plus the margin at `guard_alpha`."""
    return [
        _guard("errors", "error rate", _errors(new), _errors(old), s.max_error_excess, s),
        _guard("breaks", "stream break rate", _breaks(new), _breaks(old), s.max_break_excess, s),
    ]


def step_gates(new: Window, old: Window, s: GateSettings, look: int, looks: int) -> list[Verdict]:
    """The gates judged on a step's answers at its end, look `look` of `looks` (1-based).
    Each waits until both revisions have `min_samples` samples for it."""
    alpha = alpha_for_look(s.alpha, look, looks) / TESTS
    error, breaks = s.max_error_excess, s.max_break_excess
    return [
        _rate("errors", "error rate", _errors(new), _errors(old), error, alpha, s),
        _rate("breaks", "stream break rate", _breaks(new), _breaks(old), breaks, alpha, s),
        _latency("ttft", "time to first token per uncached token", new.ttft, old.ttft, alpha, s),
        _latency("tpot", "time per output token", new.tpot, old.tpot, alpha, s),
        _finish(new, old, alpha, s),
    ]


def overall(verdicts: Iterable[Verdict]) -> Outcome:
    """fail if any gate fails, else wait if any waits, else pass."""
    outcomes = {v.outcome for v in verdicts}
    return "fail" if "fail" in outcomes else "wait" if "wait" in outcomes else "pass"


Events = tuple[int, int]  # (events, out of how many)


def _errors(w: Window) -> Events:
    return w.errors, w.requests


def _breaks(w: Window) -> Events:
    return w.breaks, w.begun


def _guard(
    gate: str, what: str, new: Events, old: Events, margin: float, s: GateSettings
) -> Verdict:
    p, figures, reason = _excess(what, new, old, margin, s.guard_alpha)
    failed = new[0] >= GUARD_MIN_EVENTS and p < s.guard_alpha
    if not failed and new[0] < GUARD_MIN_EVENTS:
        reason += f", and {new[0]} of the {GUARD_MIN_EVENTS} events needed to fail"
    return Verdict(gate, "fail" if failed else "pass", figures, reason)


def _rate(
    gate: str, what: str, new: Events, old: Events, margin: float, alpha: float, s: GateSettings
) -> Verdict:
    if min(new[1], old[1]) < s.min_samples:
        return _waiting(gate, what, "answers", new[1], old[1], s.min_samples)
    p, figures, reason = _excess(what, new, old, margin, alpha)
    return Verdict(gate, "fail" if p < alpha else "pass", figures, reason)


def _excess(
    what: str, new: Events, old: Events, margin: float, alpha: float
) -> tuple[float, dict[str, float | int], str]:
    """binomial_excess's p-value, the figures behind it and the sentence naming them."""
    p = binomial_excess(*new, *old, margin)
    figures = _rate_figures(new, old, margin, p, alpha)
    return p, figures, f"{what}: {_rates(new, old)}, {_p(p, alpha)}"


def _latency(
    gate: str, what: str, new: Histogram, old: Histogram, alpha: float, s: GateSettings
) -> Verdict:
    if min(new.count, old.count) < s.min_samples:
        return _waiting(gate, what, "samples", new.count, old.count, s.min_samples)
    new50, old50 = _quantile(new, 0.5), _quantile(old, 0.5)
    new99, old99 = _quantile(new, TAIL), _quantile(old, TAIL)
    half = alpha / 2  # the median's test and the tail's share the gate's alpha
    p = mann_whitney_greater(new, old)
    slower = p < half and new50 >= (1 + s.latency_min_effect) * old50
    above = new.above(s.p99_ratio * old99)  # above p99_ratio x old's p99: 1% if new's p99 is
    tail_p = binomial_tail(above, new.count, 1 - TAIL)
    figures: dict[str, float | int] = {
        "new_samples": new.count, "old_samples": old.count, "new_p50": new50, "old_p50": old50,
        "p50_ratio": new50 / old50, "p": p, "new_p99": new99, "old_p99": old99,
        "p99_ratio": new99 / old99, "above_limit": above, "tail_p": tail_p, "alpha": half,
    }  # fmt: skip
    median = f"new p50 {_seconds(new50)} against old {_seconds(old50)}, {_p(p, half)}"
    if p < half and not slower:
        median += f", but less than {s.latency_min_effect:.0%} slower"
    tail = (
        f"new p99 {_seconds(new99)} against old {_seconds(old99)}, {above} of"
        f" {new.count} new samples above {s.p99_ratio:g}x old's p99, {_p(tail_p, half)}"
    )
    tail_slower = new99 > s.p99_ratio * old99 and tail_p < half
    if tail_slower and not slower:
        return Verdict(gate, "fail", figures, f"{what}: {tail}")
    outcome: Outcome = "fail" if slower or tail_slower else "pass"
    return Verdict(gate, outcome, figures, f"{what}: {median}; {tail}")


def _finish(new: Window, old: Window, alpha: float, s: GateSettings) -> Verdict:
    what = 'share of answers cut at the length limit ("length")'
    n_new, n_old = new.finished, old.finished
    if min(n_new, n_old) < s.min_samples:
        return _waiting("finish", what, "finished answers", n_new, n_old, s.min_samples)
    more = binomial_excess(new.lengths, n_new, old.lengths, n_old, s.finish_shift)
    fewer = binomial_excess(n_new - new.lengths, n_new, n_old - old.lengths, n_old, s.finish_shift)
    p = min(1.0, 2 * min(more, fewer))  # either way
    lengths = (new.lengths, n_new), (old.lengths, n_old)
    figures = _rate_figures(*lengths, s.finish_shift, p, alpha)
    reason = f"{what}: {_rates(*lengths)}, {_p(p, alpha)}"
    return Verdict("finish", "fail" if p < alpha else "pass", figures, reason)


def _waiting(gate: str, what: str, unit: str, n_new: int, n_old: int, least: int) -> Verdict:
    figures: dict[str, float | int] = {"new_samples": n_new, "old_samples": n_old, "min": least}
    reason = f"{what}: new has {n_new} {unit} and old {n_old}, of the {least} each needs"
    return Verdict(gate, "wait", figures, reason)


def _quantile(h: Histogram, q: float) -> float:
    value = h.quantile(q)
    return math.nan if value is None else value  # (callers wait for samples first)


def _rate_figures(
    new: Events, old: Events, margin: float, p: float, alpha: float
) -> dict[str, float | int]:
    return {
        "new": new[0], "new_samples": new[1], "new_rate": new[0] / new[1] if new[1] else 0.0,
        "old": old[0], "old_samples": old[1], "old_rate": old[0] / old[1] if old[1] else 0.0,
        "margin": margin, "p": p, "alpha": alpha,
    }  # fmt: skip


def _rates(new: Events, old: Events) -> str:
    def rate(x: int, n: int) -> str:
        return f"{x / n:.2%} of {n}" if n else "no answers"

    return f"new {rate(*new)} against old {rate(*old)}"


def _p(p: float, alpha: float) -> str:
    return f"p = {p:.2g} {'<' if p < alpha else '>='} {alpha:.2g}"


def _seconds(x: float) -> str:
    if x >= 1:
        return f"{x:.3g} s"
    if x >= 1e-3:
        return f"{x * 1e3:.3g} ms"
    return f"{x * 1e6:.3g} µs"
