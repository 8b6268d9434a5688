"""Turn the workers' raw timings into the numbers the report prints (microseconds, tokens/s)."""

from __future__ import annotations

import statistics
from typing import Any

AIM_RATIO = 2.0  # per-step runtime overhead <= 2x the raw broadcast latency


def pct(values_ns: list[int] | list[float]) -> dict[str, float]:
    """p50/p90/p99/mean in microseconds (nearest-rank percentiles), plus the count."""
    if not values_ns:
        return {"n": 0, "p50": float("nan"), "p90": float("nan"), "p99": float("nan")}
    ordered = sorted(values_ns)

    def rank(q: float) -> float:
        return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))] / 1e3

    return {
        "n": len(ordered),
        "p50": rank(0.50),
        "p90": rank(0.90),
        "p99": rank(0.99),
        "mean": statistics.fmean(ordered) / 1e3,
    }


def broadcast(leader: dict[str, Any], follower: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for batch, lead in leader.items():
        stamps = zip(lead["stamps_ns"], follower[batch]["stamps_ns"], strict=True)
        one_way = [t1 - t0 for t0, t1 in stamps]
        out[batch] = {
            "one_way_us": pct(one_way),
            "leader_send_call_us": pct(lead["send_call_ns"]),
            "round_trip_us": pct(lead["rtt_ns"]),
        }
    return out


def forward(data: dict[str, Any]) -> dict[str, Any]:
    return {batch: pct(d["forward_ns"]) for batch, d in data.items()}


def _decode_steps(rounds: list[dict[str, Any]], batch: int) -> dict[str, list[int]]:
    """Steps that decode the whole batch (one token per sequence), and the start-to-start
    period between consecutive such steps within a round (the loop's real cadence)."""
    step, fwd, period = [], [], []
    for rnd in rounds:
        prev_start: int | None = None
        for entries, tokens, start, ns, fwd_ns in rnd["steps"]:
            if entries != batch or tokens != batch:
                prev_start = None
                continue
            step.append(ns)
            fwd.append(fwd_ns)
            if prev_start is not None:
                period.append(start - prev_start)
            prev_start = start
    return {"step": step, "forward_in_step": fwd, "period": period}


def _throughput(rnd: dict[str, Any]) -> dict[str, float]:
    reqs = rnd["requests"]
    total = sum(len(r["token_ns"]) for r in reqs)
    first = min(r["token_ns"][0] for r in reqs)
    last = max(r["token_ns"][-1] for r in reqs)
    submit = min(r["submit_ns"] for r in reqs)
    return {
        "tokens": total,
        # every token after each request's first, over the first-to-last-token window
        "decode_tok_s": (total - len(reqs)) / ((last - first) / 1e9),
        "e2e_tok_s": total / ((last - submit) / 1e9),
        "ttft_ms": (first - submit) / 1e6,
    }


def engine(data: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for batch, rounds in data.items():
        steps = _decode_steps(rounds, int(batch))
        per_round = [_throughput(r) for r in rounds]
        out[batch] = {
            "step_us": pct(steps["step"]),
            "forward_in_step_us": pct(steps["forward_in_step"]),
            "period_us": pct(steps["period"]),
            "rounds": per_round,
            "decode_tok_s": statistics.median(r["decode_tok_s"] for r in per_round),
            "e2e_tok_s": statistics.median(r["e2e_tok_s"] for r in per_round),
            "ttft_ms": statistics.median(r["ttft_ms"] for r in per_round),
            "tokens": [r["tokens"] for r in rounds[0]["requests"]],
        }
    return out


def overhead(
    eng: dict[str, Any], fwd: dict[str, Any], bcast: dict[str, Any] | None
) -> dict[str, Any]:
    """overhead = engine step - standalone forward, at p50 (and on the cadence too)."""
    out: dict[str, Any] = {}
    for batch, e in eng.items():
        f50 = fwd[batch]["p50"]
        row: dict[str, Any] = {
            "step_p50_us": e["step_us"]["p50"],
            "period_p50_us": e["period_us"]["p50"],
            "forward_p50_us": f50,
            "overhead_us": e["step_us"]["p50"] - f50,
            "overhead_period_us": e["period_us"]["p50"] - f50,
        }
        if bcast is not None:
            lat = bcast[batch]["one_way_us"]["p50"]
            row["broadcast_one_way_p50_us"] = lat
            row["ratio"] = row["overhead_us"] / lat
            row["ratio_period"] = row["overhead_period_us"] / lat
            row["meets_aim"] = row["ratio"] <= AIM_RATIO
        out[batch] = row
    return out
