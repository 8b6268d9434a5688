"""Pass/fail checks over a run's summary: `--max-error-rate` and `--slo METRIC=LIMIT`.

A check is an upper limit on one number of the summary. Latency limits carry a unit (`2s`,
`250ms`); the error rate is a fraction (`0.01`) or a percentage (`1%`). A latency check with
no samples fails (a run where nothing succeeded met no latency objective), and so does an
error-rate check over a run that sent nothing. Parsing and judging are pure, so CI can trust
the exit status to mean exactly what the report says.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

LATENCIES = {"ttft": "ttft_ms", "itl": "itl_ms", "tpot": "tpot_ms", "e2e": "e2e_ms"}
ALIASES = {"duration": "e2e"}
STATS = ("mean", "p50", "p90", "p99", "max")
ERROR_RATE = "error_rate"
UNITS = {"ms": 1.0, "s": 1000.0}
FORMS = (
    "METRIC=LIMIT, METRIC one of ttft, itl, tpot, e2e (or duration) with _mean, _p50, _p90, "
    "_p99 or _max, and LIMIT like 2s or 250ms; or error_rate=0.01 (or 1%)"
)


class CheckError(ValueError):
    """A check the user wrote cannot be used; the message names the flag and the value."""


@dataclass(frozen=True, slots=True)
class Check:
    """`metric` is canonical (`ttft_p99`, `error_rate`); latency limits are in ms."""

    metric: str
    limit: float
    source: str  # how the user wrote it, for the report

    @property
    def latency(self) -> tuple[str, str] | None:
        """(summary key, statistic) for a latency check, None for the error rate."""
        if self.metric == ERROR_RATE:
            return None
        name, _, stat = self.metric.rpartition("_")
        return LATENCIES[name], stat


@dataclass(frozen=True, slots=True)
class Verdict:
    check: Check
    observed: float | None
    passed: bool
    detail: str

    def to_json(self) -> dict[str, object]:
        return {
            "check": self.check.source,
            "metric": self.check.metric,
            "limit": self.check.limit,
            "observed": self.observed,
            "passed": self.passed,
            "detail": self.detail,
        }


def parse_slo(text: str) -> Check:
    name, sep, limit = (part.strip() for part in text.partition("="))
    if not sep or not limit:
        raise CheckError(f"--slo {text!r}: expected {FORMS}")
    metric = _metric(name.lower(), text)
    if metric == ERROR_RATE:
        return Check(metric, _rate(limit, f"--slo {text!r}"), f"--slo {text}")
    return Check(metric, _duration_ms(limit, text), f"--slo {text}")


def max_error_rate(value: float) -> Check:
    if not 0.0 <= value <= 1.0:
        raise CheckError(f"--max-error-rate {value!r}: must be a fraction within [0, 1]")
    return Check(ERROR_RATE, value, f"--max-error-rate {value:g}")


def _metric(name: str, text: str) -> str:
    if name == ERROR_RATE:
        return name
    base, _, stat = name.rpartition("_")
    base = ALIASES.get(base, base)
    if base not in LATENCIES or stat not in STATS:
        raise CheckError(f"--slo {text!r}: unknown metric {name!r}; expected {FORMS}")
    return f"{base}_{stat}"


def _duration_ms(limit: str, text: str) -> float:
    for unit in ("ms", "s"):  # "ms" first: "250ms" also ends in "s"
        if limit.lower().endswith(unit):
            value = _number(limit[: -len(unit)], f"--slo {text!r}")
            if value < 0:
                break
            return value * UNITS[unit]
    raise CheckError(f"--slo {text!r}: a latency limit is a duration such as 2s or 250ms")


def _rate(limit: str, where: str) -> float:
    percent = limit.endswith("%")
    value = _number(limit.rstrip("%"), where) / (100 if percent else 1)
    if not 0.0 <= value <= 1.0:
        raise CheckError(f"{where}: an error rate is a fraction within [0, 1] or a percentage")
    return value


def _number(text: str, where: str) -> float:
    try:
        value = float(text.strip())
    except ValueError:
        raise CheckError(f"{where}: {text.strip()!r} is not a number") from None
    if not math.isfinite(value):
        raise CheckError(f"{where}: the limit must be finite")
    return value


def judge(checks: list[Check], summary: Mapping[str, object]) -> list[Verdict]:
    return [_judge(check, summary) for check in checks]


def _judge(check: Check, summary: Mapping[str, object]) -> Verdict:
    where = check.latency
    if where is None:
        return _judge_rate(check, summary)
    dist = summary.get(where[0])
    value = dist.get(where[1]) if isinstance(dist, Mapping) else None
    if not isinstance(value, int | float):
        return Verdict(check, None, False, f"{check.metric}: no samples to judge")
    passed = value <= check.limit
    sign = "<=" if passed else ">"
    return Verdict(check, value, passed, f"{check.metric} {value:.1f} ms {sign} {check.limit:g} ms")


def _judge_rate(check: Check, summary: Mapping[str, object]) -> Verdict:
    sent, failed = summary.get("requests"), summary.get("failed")
    if not isinstance(sent, int) or not isinstance(failed, int) or sent == 0:
        cut = summary.get("cut")
        if isinstance(cut, int) and cut > 0:
            detail = f"error_rate: no request ended, {cut} cut at the end of the grace"
            return Verdict(check, None, False, detail)
        return Verdict(check, None, False, "error_rate: no requests were sent")
    rate = failed / sent
    passed = rate <= check.limit
    sign = "<=" if passed else ">"
    detail = f"error_rate {rate:.4g} ({failed} of {sent} failed) {sign} {check.limit:g}"
    return Verdict(check, rate, passed, detail)


def checks_section(verdicts: list[Verdict]) -> str:
    lines = ["checks"]
    for v in verdicts:
        lines.append(f"  {'PASS' if v.passed else 'FAIL'}  {v.detail}  ({v.check.source})")
    failed = sum(not v.passed for v in verdicts)
    lines.append(f"checks: {failed} of {len(verdicts)} failed" if failed else "checks: all passed")
    return "\n".join(lines)
