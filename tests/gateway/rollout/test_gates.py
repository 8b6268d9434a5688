"""The gates' statistics on generated samples (a seeded RNG; no clock), and simulated rollouts:
how often an identical revision is rolled back, and how soon a worse one is."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from random import Random

import pytest

from gateway.rollout.gates import (
    TESTS,
    GateSettings,
    Outcome,
    Verdict,
    alpha_for_look,
    binomial_excess,
    binomial_tail,
    guards,
    mann_whitney_greater,
    overall,
    step_gates,
)
from gateway.rollout.samples import Histogram, Window


def lognormal(rng: Random, n: int, median: float, sigma: float = 0.5) -> Histogram:
    histogram = Histogram()
    for _ in range(n):
        histogram.add(median * rng.lognormvariate(0, sigma))
    return histogram


def test_identical_distributions_give_uniform_p_values() -> None:
    rng = Random(1)
    p = [
        mann_whitney_greater(lognormal(rng, 100, 0.1), lognormal(rng, 100, 0.1)) for _ in range(200)
    ]
    assert 0.01 <= sum(x < 0.05 for x in p) / len(p) <= 0.10
    assert 0.35 <= sum(x < 0.5 for x in p) / len(p) <= 0.65


def test_a_30_percent_slower_revision_is_found() -> None:
    rng = Random(2)
    assert mann_whitney_greater(lognormal(rng, 200, 0.13), lognormal(rng, 200, 0.1)) < 0.001
    assert mann_whitney_greater(lognormal(rng, 200, 0.1), lognormal(rng, 200, 0.13)) > 0.9


def test_all_ties_and_no_samples_tell_nothing() -> None:
    new, old = Histogram(), Histogram()
    for _ in range(100):
        new.add(0.1)
        old.add(0.1)
    assert mann_whitney_greater(new, old) == 1.0
    assert mann_whitney_greater(new, Histogram()) == 1.0
    assert mann_whitney_greater(Histogram(), old) == 1.0
    one = Histogram()
    one.add(0.1)
    assert 0.4 <= mann_whitney_greater(one, old) <= 1.0


def test_binomial_tail_matches_the_sum_of_its_terms() -> None:
    for n in (1, 7, 60, 400):
        for p in (0.001, 0.01, 0.3, 0.5, 0.97):
            for k in range(0, n + 2, 1 + n // 50):
                exact = sum(math.comb(n, j) * p**j * (1 - p) ** (n - j) for j in range(k, n + 1))
                assert binomial_tail(k, n, p) == pytest.approx(exact, rel=1e-9, abs=1e-13)
    assert binomial_tail(0, 10, 0.0) == 1.0 and binomial_tail(1, 10, 0.0) == 0.0
    assert binomial_tail(10, 10, 1.0) == 1.0 and binomial_tail(11, 10, 1.0) == 0.0


def test_binomial_excess() -> None:
    assert binomial_excess(20, 400, 0, 400, 0.01) < 0.001  # 5% against 0%
    assert binomial_excess(4, 400, 4, 400, 0.01) > 0.3
    assert binomial_excess(40, 400, 40, 400, 0.0) > 0.3
    assert binomial_excess(0, 0, 5, 100, 0.01) == 1.0
    assert binomial_excess(3, 20, 0, 0, 0.01) > 0.5  # no old answers: no proof
    assert binomial_excess(20, 20, 0, 0, 0.01) < 0.001  # unless new fails everything
    big = binomial_excess(10_600, 1_000_000, 10_000, 1_000_000, 0.0)
    assert 0 < big < 1e-6
    assert binomial_excess(10_000, 1_000_000, 10_000, 1_000_000, 0.0) > 0.4
    assert binomial_excess(1_000_000, 1_000_000, 0, 1_000_000, 0.01) == 0.0


def test_the_looks_share_alpha() -> None:
    assert sum(alpha_for_look(0.05, k, 8) for k in range(1, 9)) == pytest.approx(0.05)
    for look in (0, 9):
        with pytest.raises(ValueError, match="look"):
            alpha_for_look(0.05, look, 8)


def test_settings_name_a_bad_value() -> None:
    with pytest.raises(ValueError, match="max_error_excess"):
        GateSettings(max_error_excess=-0.1)
    with pytest.raises(ValueError, match="min_samples"):
        GateSettings(min_samples=0)
    with pytest.raises(ValueError, match="alpha"):
        GateSettings(alpha=0.0)


def test_overall() -> None:
    def verdict(outcome: Outcome) -> Verdict:
        return Verdict("g", outcome, {}, "")

    assert overall([verdict("pass"), verdict("wait"), verdict("fail")]) == "fail"
    assert overall([verdict("pass"), verdict("wait")]) == "wait"
    assert overall([verdict("pass"), verdict("pass")]) == "pass"


# Simulated traffic


@dataclass(frozen=True)
class Revision:
    error_rate: float = 0.01
    break_rate: float = 0.005
    ttft_per_token: float = 0.0002  # seconds per uncached prompt token, the median
    length_share: float = 0.2
    tail: float = 0.0  # share of first tokens 10x slower


# Noise for the simulated latencies, drawn once (a pick from a pool is cheaper than a draw):
# lognormal, sigma 0.5 for the time to first token and 0.3 for the time per output token.
def normal(n: int, seed: int = 0) -> list[float]:
    rng = Random(seed)
    return [rng.gauss(0, 1) for _ in range(n)]


_NORMAL = normal(1 << 14)
TTFT_NOISE = [math.exp(0.5 * z) for z in _NORMAL]
TPOT_NOISE = [math.exp(0.3 * z) for z in _NORMAL]


def serve(window: Window, rng: Random, revision: Revision, n: int) -> None:
    r, add, size = rng.random, window.add, len(_NORMAL)
    errors, breaks, lengths, tail = (
        revision.error_rate,
        revision.break_rate,
        revision.length_share,
        revision.tail,
    )
    for _ in range(n):
        if r() < errors:
            add(error=True)
            continue
        uncached = 20 + int(r() * 2000)
        ttft = revision.ttft_per_token * uncached * TTFT_NOISE[int(r() * size)]
        if tail and r() < tail:
            ttft *= 10
        broke = r() < breaks
        add(
            broke=broke,
            resumed=broke,
            finish=None if broke else "length" if r() < lengths else "stop",
            ttft=ttft,
            uncached_tokens=uncached,
            tpot=0.03 * TPOT_NOISE[int(r() * size)],
        )


def window(rng: Random, revision: Revision, n: int) -> Window:
    w = Window()
    serve(w, rng, revision, n)
    return w


def test_gates_wait_for_samples_and_say_how_many() -> None:
    s = GateSettings()
    for new, old in ((Window(), Window()), (window(Random(3), Revision(), 49), Window())):
        verdicts = step_gates(new, old, s, 1, 8)
        assert [v.gate for v in verdicts] == ["errors", "breaks", "ttft", "tpot", "finish"]
        assert all(v.outcome == "wait" for v in verdicts)
        assert overall(verdicts) == "wait"
        assert (
            f"new has {new.requests} answers and old 0, of the 50 each needs" in verdicts[0].reason
        )
    new, old = window(Random(4), Revision(), 49), window(Random(5), Revision(), 500)
    by_gate = {v.gate: v for v in step_gates(new, old, s, 1, 8)}
    assert by_gate["errors"].outcome == "wait"
    assert by_gate["ttft"].figures == {
        "new_samples": new.ttft.count,
        "old_samples": 500 - old.errors,
        "min": 50,
    }


def test_guards_never_wait() -> None:
    s = GateSettings()
    assert [v.outcome for v in guards(Window(), Window(), s)] == ["pass", "pass"]
    new = Window()
    for _ in range(2):
        new.add(error=True)
    verdict = guards(new, window(Random(6), Revision(error_rate=0), 1000), s)[0]
    assert verdict.outcome == "pass" and "2 of the 3 events needed" in verdict.reason
    new.add(error=True)
    assert guards(new, window(Random(6), Revision(error_rate=0), 1000), s)[0].outcome == "fail"


def test_identical_revisions_pass_with_enough_samples() -> None:
    rng = Random(7)
    verdicts = step_gates(
        window(rng, Revision(), 300), window(rng, Revision(), 300), GateSettings(), 1, 8
    )
    assert overall(verdicts) == "pass", [v.reason for v in verdicts if v.outcome != "pass"]


def test_a_slower_median_fails_the_gate_and_says_by_how_much() -> None:
    rng = Random(8)
    new, old = window(rng, Revision(ttft_per_token=0.0003), 300), window(rng, Revision(), 300)
    ttft = step_gates(new, old, GateSettings(), 1, 8)[2]
    assert ttft.outcome == "fail"
    assert ttft.figures["p"] < ttft.figures["alpha"] == pytest.approx(0.05 / 8 / TESTS / 2)
    assert ttft.figures["p50_ratio"] > 1.3
    assert re.match(
        r"time to first token per uncached token: new p50 [\d.]+ µs against old [\d.]+ µs,"
        r" p = \S+ < \S+; new p99 ",
        ttft.reason,
    ), ttft.reason


def test_a_significant_but_small_slowdown_passes() -> None:
    rng = Random(9)
    new, old = (
        window(rng, Revision(ttft_per_token=0.000208), 20_000),
        window(rng, Revision(), 20_000),
    )
    ttft = step_gates(new, old, GateSettings(), 1, 8)[2]
    assert ttft.figures["p"] < 1e-6
    assert ttft.outcome == "pass" and "but less than 10% slower" in ttft.reason


def test_a_slow_tail_fails_the_gate() -> None:
    """5% of first tokens 10x slower: the median hardly moves, the p99 is five times old's."""
    rng = Random(10)
    new, old = window(rng, Revision(tail=0.05), 1000), window(rng, Revision(), 1000)
    ttft = step_gates(new, old, GateSettings(), 1, 8)[2]
    assert ttft.outcome == "fail"
    assert ttft.figures["tail_p"] < ttft.figures["alpha"] and ttft.figures["p99_ratio"] > 3
    assert ttft.reason.startswith("time to first token per uncached token: new p99 ")


def test_a_tail_is_not_judged_on_its_few_largest_samples() -> None:
    """50 samples each of one distribution: their p99s are their largest, often 1.5x apart."""
    rng, s = Random(11), GateSettings()
    ratios, fails = [], 0
    for _ in range(200):
        new, old = window(rng, Revision(error_rate=0), 50), window(rng, Revision(error_rate=0), 50)
        ttft = step_gates(new, old, s, 1, 8)[2]
        ratios.append(ttft.figures["p99_ratio"])
        fails += ttft.outcome == "fail"
    assert sum(r > s.p99_ratio for r in ratios) >= 10
    assert fails == 0


def test_a_shift_of_finish_reasons_fails_either_way() -> None:
    s = GateSettings()
    for share in (0.5, 0.0):
        rng = Random(11)
        new, old = window(rng, Revision(length_share=share), 300), window(rng, Revision(), 300)
        finish = step_gates(new, old, s, 1, 8)[4]
        assert finish.outcome == "fail", finish.reason


# Simulated rollouts: 2 cells of 4 steps; every step, 100 to 300 requests of each revision over
# 30 "seconds", the guards judged every second on the totals since the cell began, the step's
# gates at its end on the step's answers (as gateway/rollout/collector.py collects them).

CELLS, STEPS, SECONDS = 2, 4, 30
LOOKS = CELLS * STEPS


def counts(total: Window, step: Window) -> Window:
    """What the guards read of `total` and `step` together (no latencies)."""
    return Window(
        requests=total.requests + step.requests,
        errors=total.errors + step.errors,
        breaks=total.breaks + step.breaks,
    )


def rollout(rng: Random, new: Revision, old: Revision, *, gates: bool = True) -> int | None:
    """The look at which the rollout was rolled back, None if it completed."""
    s = GateSettings()
    for look in range(1, LOOKS + 1):
        if look % STEPS == 1:
            new_cell, old_cell = Window(), Window()
        new_step, old_step = Window(), Window()
        n_new, n_old = rng.randint(100, 300), rng.randint(100, 300)
        for second in range(SECONDS):
            serve(new_step, rng, new, portion(n_new, second))
            serve(old_step, rng, old, portion(n_old, second))
            guarded = guards(counts(new_cell, new_step), counts(old_cell, old_step), s)
            if overall(guarded) == "fail":
                return look
        if gates and overall(step_gates(new_step, old_step, s, look, LOOKS)) == "fail":
            return look
        new_cell, old_cell = counts(new_cell, new_step), counts(old_cell, old_step)
    return None


def portion(n: int, second: int) -> int:
    """The requests of a step's `n` that end in its `second`."""
    return (second + 1) * n // SECONDS - second * n // SECONDS


def rollouts(seed: int, n: int, new: Revision, *, gates: bool = True) -> list[int | None]:
    rng = Random(seed)
    return [rollout(rng, new, Revision(), gates=gates) for _ in range(n)]


@pytest.mark.slow  # 1.3 million simulated requests: about 5 s
def test_an_identical_revision_is_rarely_rolled_back() -> None:
    looks = rollouts(12, 400, Revision())
    rate = sum(look is not None for look in looks) / len(looks)
    print(f"false rollbacks: {rate:.2%} of {len(looks)} rollouts")
    assert rate <= 0.05


def test_a_30_percent_slower_first_token_is_stopped_in_the_first_cell() -> None:
    looks = rollouts(13, 200, Revision(ttft_per_token=0.00026))
    rate = sum(look is not None and look <= STEPS for look in looks) / len(looks)
    print(f"+30% ttft stopped in the first cell: {rate:.2%} of {len(looks)} rollouts")
    assert rate >= 0.95


@pytest.mark.parametrize("bad", [Revision(error_rate=0.05), Revision(break_rate=0.05)])
def test_the_guards_alone_stop_a_failing_revision(bad: Revision) -> None:
    looks = rollouts(14, 100, bad, gates=False)
    rate = sum(look is not None for look in looks) / len(looks)
    early = sum(look is not None and look <= STEPS for look in looks) / len(looks)
    print(f"{bad}: stopped by the guards in {rate:.0%}, in the first cell in {early:.0%}")
    assert rate >= 0.95
