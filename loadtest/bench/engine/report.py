"""The stdout table."""

from __future__ import annotations

from typing import Any

from loadtest.bench.engine.analyze import AIM_RATIO


def _p(d: dict[str, float]) -> str:
    return f"{d['p50']:9.1f} {d['p90']:9.1f} {d['p99']:9.1f}"


_PARTS = {
    "model": "model (both ranks in forward -> forward end)",
    "runtime": "runtime in the step (all the rest):",
    "schedule": "  leader: step start -> send()",
    "send": "  leader: send() call",
    "publish": "  leader: send() return -> forward (events out)",
    "wire": "  send() start -> follower receive() returned",
    "follower_decode": "  follower: receive() returned -> forward",
    "post": "  leader: forward end -> step end (sample, events)",
    "follower_lag": "follower forward start - leader's",
    "gap": "between steps (leader inbox, loop)",
    "cadence": "runtime per step with the gap",
}


def render(res: dict[str, Any]) -> str:
    m = res["machine"]
    lines = [
        f"machine: {m['cpu_model']}, {m['cpu_count']} cpus, python {m['python']}, "
        f"torch {m['torch']}; loadavg start {m['loadavg_start']} end {m['loadavg_end']}",
        f"settings: {res['settings']}",
        "",
        "1. step message broadcast (Gloo, 2 ranks, 127.0.0.1), microseconds",
        f"{'batch':>5}  {'what':<34} {'p50':>9} {'p90':>9} {'p99':>9}",
    ]
    for batch, b in res["broadcast"].items():
        lines.append(
            f"{batch:>5}  {'one-way send()->receive() returned':<34} " + _p(b["one_way_us"])
        )
        lines.append(f"{'':>5}  {'leader send() call':<34} " + _p(b["leader_send_call_us"]))
        lines.append(f"{'':>5}  {'round trip (+1-value ack)':<34} " + _p(b["round_trip_us"]))
    lines.append("       the same message sent between lockstep forwards (a bare step loop):")
    for batch, b in res["bare_loop"].items():
        lines.append(
            f"{batch:>5}  {'one-way send()->receive() returned':<34} " + _p(b["one_way_us"])
        )
        lines.append(f"{'':>5}  {'leader send() call':<34} " + _p(b["leader_send_call_us"]))
    lines += [
        "",
        "2. per-step runtime overhead at TP=2 (1 torch thread per rank), paired within each "
        "step, microseconds",
        f"{'batch':>5}  {'part':<46} {'p50':>9} {'p90':>9} {'p99':>9}",
    ]
    for batch, r in res["runtime"].items():
        for i, (key, label) in enumerate(_PARTS.items()):
            lines.append(f"{batch if i == 0 else '':>5}  {label:<46} " + _p(r[key]))
        ok = "PASS" if r["meets_aim"] else "FAIL"
        lines.append(
            f"{'':>5}  runtime / bare-loop one-way p50 ({r['broadcast_one_way_p50_us']:.1f} us):"
            f" {r['ratio']:.2f}x in the step [{ok}], {r['ratio_cadence']:.2f}x with the gap"
        )
        lines.append(
            f"{'':>5}  runtime / ping-pong one-way p50 ({r['pingpong_one_way_p50_us']:.1f} us):"
            f" {r['ratio_pingpong']:.2f}x"
        )
    lines.append(
        f"  aim: runtime per step <= {AIM_RATIO:g}x the step message's one-way p50 when sent "
        "as a step sends it (the bare loop in 1.)"
    )
    lines.append("  context, p50 us: lockstep forward alone (no runtime) vs model time in the step")
    for batch, r in res["runtime"].items():
        alone = res["forward_us"]["tp2_t1"][batch]["p50"]
        lines.append(f"    TP=2 b{batch}: {alone:.1f} alone, {r['model']['p50']:.1f} in the step")
    lines.append("  TP=1 (no follower), p50 us: step / forward in the step / step - forward")
    for key, eng in res["engine"].items():
        if key.startswith("tp1"):
            for batch, e in eng.items():
                lines.append(
                    f"    {key} b{batch}: {e['step_us']['p50']:.1f} / "
                    f"{e['forward_in_step_us']['p50']:.1f} / "
                    f"{e['step_minus_forward_us']['p50']:.1f}"
                )
    lines += [
        "",
        f"3. decode throughput via LeaderEngine.generate ({res['settings']['max_tokens']} "
        "greedy tokens each, ignore_eos), median over rounds",
        f"{'config':<22} {'batch':>5} {'decode tok/s':>13} {'e2e tok/s':>10} {'ttft ms':>8}"
        f" {'step p50 us':>12}",
    ]
    for key, eng in res["engine"].items():
        for batch, e in eng.items():
            lines.append(
                f"{res['configs'][key]:<22} {batch:>5} {e['decode_tok_s']:13.1f} "
                f"{e['e2e_tok_s']:10.1f} {e['ttft_ms']:8.2f} {e['step_us']['p50']:12.1f}"
            )
    lines.append(f"greedy outputs identical across configs: {res['outputs_identical']}")
    return "\n".join(lines)
