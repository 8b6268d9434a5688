"""The stdout table."""

from __future__ import annotations

from typing import Any

from loadtest.benchengine.analyze import AIM_RATIO


def _p(d: dict[str, float]) -> str:
    return f"{d['p50']:9.1f} {d['p90']:9.1f} {d['p99']:9.1f}"


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
    lines += [
        "",
        "2. per-step overhead at TP=2 (1 torch thread per rank), microseconds (p50)",
        f"{'batch':>5} {'step':>9} {'forward':>9} {'overhead':>9} {'bcast':>8} {'ratio':>6}"
        f"  {'aim':<5} {'period':>9} {'ovh(per)':>9} {'ratio':>6}  {'fwd-in-step':>11}",
    ]
    tp2 = res["engine"]["tp2_t1"]
    for batch, o in res["overhead"]["tp2_t1"].items():
        ok = "PASS" if o["meets_aim"] else "FAIL"
        lines.append(
            f"{batch:>5} {o['step_p50_us']:9.1f} {o['forward_p50_us']:9.1f} "
            f"{o['overhead_us']:9.1f} {o['broadcast_one_way_p50_us']:8.1f} {o['ratio']:6.2f}"
            f"  {ok:<5} {o['period_p50_us']:9.1f} {o['overhead_period_us']:9.1f} "
            f"{o['ratio_period']:6.2f}  {tp2[batch]['forward_in_step_us']['p50']:11.1f}"
        )
    lines.append(
        f"  aim: overhead <= {AIM_RATIO:g}x one-way broadcast p50; ratio uses the step function, "
        "ratio(per) the step-start cadence"
    )
    lines.append("  TP=1 reference (no messaging), p50 us: step / forward / overhead")
    for key in res["overhead"]:
        if key.startswith("tp1"):
            for batch, o in res["overhead"][key].items():
                lines.append(
                    f"    {key} b{batch}: {o['step_p50_us']:.1f} / {o['forward_p50_us']:.1f} / "
                    f"{o['overhead_us']:.1f}"
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
