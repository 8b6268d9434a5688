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
    """The step message's one-way latency and leader send() call, from the ping-pong (which
    also has the round trip) or from the bare step loop (which has not)."""
    out: dict[str, Any] = {}
    for batch, lead in leader.items():
        stamps = zip(lead["stamps_ns"], follower[batch]["stamps_ns"], strict=True)
        out[batch] = {
            "one_way_us": pct([t1 - t0 for t0, t1 in stamps]),
            "leader_send_call_us": pct(lead["send_call_ns"]),
        }
        if "rtt_ns" in lead:
            out[batch]["round_trip_us"] = pct(lead["rtt_ns"])
    return out


def forward(data: dict[str, Any]) -> dict[str, Any]:
    return {batch: pct(d["forward_ns"]) for batch, d in data.items()}


def _decode_steps(rounds: list[dict[str, Any]], batch: int) -> dict[str, list[int]]:
    """Steps that decode the whole batch (one token per sequence), the start-to-start period
    between consecutive such steps within a round (the loop's real cadence), and each step
    minus its own forward."""
    step, fwd, period, runtime = [], [], [], []
    for rnd in rounds:
        prev_start: int | None = None
        for entries, tokens, start, end, f0, f1, *_ in rnd["steps"]:
            if entries != batch or tokens != batch:
                prev_start = None
                continue
            step.append(end - start)
            fwd.append(f1 - f0)
            runtime.append(end - start - (f1 - f0))
            if prev_start is not None:
                period.append(start - prev_start)
            prev_start = start
    return {"step": step, "forward_in_step": fwd, "period": period, "runtime": runtime}


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
            # exact at world size 1 only: with a follower, see `runtime` (paired stamps)
            "step_minus_forward_us": pct(steps["runtime"]),
            "rounds": per_round,
            "decode_tok_s": statistics.median(r["decode_tok_s"] for r in per_round),
            "e2e_tok_s": statistics.median(r["e2e_tok_s"] for r in per_round),
            "ttft_ms": statistics.median(r["ttft_ms"] for r in per_round),
            "tokens": [r["tokens"] for r in rounds[0]["requests"]],
        }
    return out


def _paired_steps(
    rounds: list[dict[str, Any]], follower: list[list[int]], batch: int
) -> dict[str, list[int]]:
    """Split every full-batch decode step into model time and runtime time, within the step.

    The leader's i-th forward and the follower's i-th forward are the same step (the follower
    runs exactly the STEP messages, in order). The model runs from the moment both ranks are
    inside forward (`ready`: the later of their two forward starts; whoever starts first waits
    at the first all-reduce) to the end of the leader's forward. Everything else in the step is
    the runtime's: schedule + step message + the follower decoding it (before `ready`), and
    sampling + scheduler update + token events (after the forward). `gap` is the time from one
    step's end to the next step's start (inbox, loop); `cadence` = runtime + gap, i.e. the
    start-to-start period minus the model time, what the runtime costs per token of the batch.
    Pairing within one step cancels the run-to-run noise of the model time (Gloo all-reduce
    tails), which differencing two separately measured p50s did not.
    """
    keys = ("model", "runtime", "pre", "post", "follower_lag", "gap", "cadence", "schedule")
    extra = ("send", "publish", "wire", "follower_decode")
    out: dict[str, list[int]] = {k: [] for k in (*keys, *extra)}
    for rnd in rounds:
        prev: tuple[int, int] | None = None  # (step end, runtime) of the previous decode step
        for i, (entries, tokens, t0, t1, f0, f1, s0, s1) in enumerate(rnd["steps"]):
            f_entries, f_tokens, g0, _, _, r1 = follower[rnd["first_step"] + i]
            if (f_entries, f_tokens) != (entries, tokens):
                raise ValueError(f"step {rnd['first_step'] + i}: leader and follower differ")
            if entries != batch or tokens != batch:
                prev = None
                continue
            ready = max(f0, g0)
            runtime = (t1 - t0) - (f1 - ready)
            out["model"].append(f1 - ready)
            out["runtime"].append(runtime)
            out["pre"].append(ready - t0)
            out["post"].append(t1 - f1)
            out["follower_lag"].append(g0 - f0)
            out["schedule"].append(s0 - t0)
            out["send"].append(s1 - s0)
            out["publish"].append(f0 - s1)
            out["wire"].append(r1 - s0)
            out["follower_decode"].append(g0 - r1)
            if prev is not None:
                out["gap"].append(t0 - prev[0])
                out["cadence"].append(prev[1] + t0 - prev[0])
            prev = (t1, runtime)
    return out


def runtime(
    leader: dict[str, Any],
    follower: list[list[int]],
    bcast: dict[str, Any],
    bare: dict[str, Any],
) -> dict[str, Any]:
    """Per-step runtime overhead at TP=2 from paired stamps, against the one-way broadcast
    of the step message: sent between forwards in a bare loop (the aim's reference: the same
    conditions as in a step) and in a tight ping-pong (a lower bound no step can reach)."""
    out: dict[str, Any] = {}
    for batch, rounds in leader.items():
        parts = _paired_steps(rounds, follower, int(batch))
        row: dict[str, Any] = {k: pct(v) for k, v in parts.items()}
        loop, ping = bare[batch]["one_way_us"]["p50"], bcast[batch]["one_way_us"]["p50"]
        row["broadcast_one_way_p50_us"] = loop
        row["pingpong_one_way_p50_us"] = ping
        row["ratio"] = row["runtime"]["p50"] / loop
        row["ratio_cadence"] = row["cadence"]["p50"] / loop
        row["ratio_pingpong"] = row["runtime"]["p50"] / ping
        row["meets_aim"] = row["ratio"] <= AIM_RATIO
        out[batch] = row
    return out
