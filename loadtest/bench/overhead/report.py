"""Runs turned into comparison rows, printed as a table and written as JSON."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import orjson

from loadtest.bench.machine import machine_facts
from loadtest.bench.overhead.cluster import Cluster
from loadtest.bench.overhead.load import Run
from loadtest.bench.overhead.params import CONCURRENCIES, ITLS_MS, MODES, PEERS, PYTHON_MODES
from loadtest.bench.processes import Pins
from loadtest.gen.stats import percentile

# The project's aims, at every concurrency the benchmark runs. CPU: the resumable gateway's
# (native relay) CPU per request at most the floor relay's plus this many us, keyed by
# inter-token delay (ms); an ITL not keyed here has no aim. TTFT: the resumable gateway's p99 no
# worse than vllm-router's. The CPU ratios to the peers are printed for information only.
ABOVE_FLOOR_US = {0.0: 150.0, 20.0: 600.0}
TTFT_P99_AIM = "<= vllm-router"
COLUMNS = (
    "ITL ms", "c", "direct/s", "floor/s", "gw/s", "gw/direct", "floor CPU us/req",
    "gw CPU us/req", "gw above floor us (aim)", "gw/floor CPU", "TTFT direct p50/p99",
    "TTFT gw p50/p99", "added TTFT p50/p99", "floor added TTFT p50/p99", "resume off CPU us/req",
    "plain above floor us", "resume cost", "fail",
)  # fmt: skip


def _pct(values: Sequence[float], q: float) -> float:
    """loadtest.gen's nearest rank, so a reported percentile is a latency some request saw."""
    return percentile(sorted(values), q) if values else math.nan


def _ratio(a: float, b: float) -> float:
    return a / b if b else math.nan


def _meets(value: float, aim: float) -> float:
    """value <= aim, or nan when either is not a number (no aim, or nothing measured)."""
    return math.nan if math.isnan(value) or math.isnan(aim) else value <= aim


def _compare(runs: dict[str, Run]) -> dict[str, float]:
    """Added TTFT is a difference of percentiles: requests of two modes are not paired."""
    direct, floor, plain, gw = (runs[mode] for mode in MODES)
    row: dict[str, float] = {"itl_ms": gw.itl_ms, "concurrency": gw.concurrency}
    row |= {"direct_rps": direct.rps, "floor_rps": floor.rps, "gateway_rps": gw.rps}
    row["ratio"] = _ratio(gw.rps, direct.rps)
    floor_cpu, gw_cpu = floor.relay_cpu_us_per_request, gw.relay_cpu_us_per_request
    row |= {"floor_cpu_us_per_request": floor_cpu, "gateway_cpu_us_per_request": gw_cpu}
    row["gateway_floor_cpu_ratio"] = _ratio(gw_cpu, floor_cpu)
    row |= _above_floor(gw.itl_ms, floor_cpu, gw_cpu)
    for q, name in ((50, "p50"), (99, "p99")):
        d, f, g = (_pct(r.ttft_ms, q) for r in (direct, floor, gw))
        row |= {f"ttft_direct_{name}_ms": d, f"ttft_floor_{name}_ms": f}
        row[f"ttft_gateway_{name}_ms"] = g
        row |= {f"added_ttft_{name}_ms": g - d, f"floor_added_ttft_{name}_ms": f - d}
    plain_cpu = plain.relay_cpu_us_per_request
    row["gateway_plain_cpu_us_per_request"] = plain_cpu
    row["plain_above_floor_us"] = plain_cpu - floor_cpu  # for information: no aim
    row["resume_cpu_ratio"] = _ratio(gw_cpu, plain_cpu)  # what tracking for resumption costs
    nginx, router = runs.get("nginx"), runs.get("vllm-router")
    nginx_cpu = nginx.relay_cpu_us_per_request if nginx else math.nan
    router_cpu = router.relay_cpu_us_per_request if router else math.nan
    row |= {"nginx_cpu_us_per_request": nginx_cpu, "router_cpu_us_per_request": router_cpu}
    # The ratios to the peers are for information: no aim is set on them.
    row["gateway_router_cpu_ratio"] = _ratio(gw_cpu, router_cpu)
    row["plain_nginx_cpu_ratio"] = _ratio(plain_cpu, nginx_cpu)
    for mode in PYTHON_MODES:
        run = runs.get(mode)
        key = mode.replace("-", "_")
        row[f"{key}_cpu_us_per_request"] = run.relay_cpu_us_per_request if run else math.nan
        row[f"{key}_ttft_p99_ms"] = _pct(run.ttft_ms, 99) if run else math.nan
    row["gateway_py_router_cpu_ratio"] = _ratio(row["gateway_py_cpu_us_per_request"], router_cpu)
    row["plain_py_nginx_cpu_ratio"] = _ratio(row["gateway_plain_py_cpu_us_per_request"], nginx_cpu)
    row["router_ttft_p99_ms"] = _pct(router.ttft_ms, 99) if router else math.nan
    row["nginx_ttft_p99_ms"] = _pct(nginx.ttft_ms, 99) if nginx else math.nan
    row["meets_ttft_p99_aim"] = _meets(row["ttft_gateway_p99_ms"], row["router_ttft_p99_ms"])
    row["failures"] = sum(run.failures for run in runs.values())
    return row


def _above_floor(itl_ms: float, floor: float, gateway: float) -> dict[str, float]:
    """The CPU aim: what the resumable gateway spends above the floor relay, which forwards
    bytes and does nothing per request, against the allowance for this ITL (nan: none)."""
    above, aim = gateway - floor, ABOVE_FLOOR_US.get(itl_ms, math.nan)
    return {
        "gateway_above_floor_us": above,
        "above_floor_aim_us": aim,
        "meets_above_floor_aim": _meets(above, aim),
    }


def rows(runs: Sequence[Run]) -> list[dict[str, float]]:
    """One row per (ITL, concurrency), whatever order the runs came in."""
    by = {(r.itl_ms, r.concurrency, r.mode): r for r in runs}
    modes = (*MODES, *PEERS, *PYTHON_MODES)
    return [
        _compare({m: by[itl, c, m] for m in modes if (itl, c, m) in by})
        for itl in ITLS_MS
        for c in CONCURRENCIES
    ]


def _above_floor_cell(r: dict[str, float]) -> str:
    """`163 (<=150 MISS)`; the allowance alone when nothing was measured; no verdict for an
    ITL without an aim."""
    above, aim = r["gateway_above_floor_us"], r["above_floor_aim_us"]
    if math.isnan(aim):
        return f"{above:.0f}"
    meets = r["meets_above_floor_aim"]
    verdict = "" if math.isnan(meets) else f" {'ok' if meets else 'MISS'}"
    return f"{above:.0f} (<={aim:g}{verdict})"


def _pair(row: dict[str, float], name: str) -> str:
    return f"{row[f'{name}_p50_ms']:.2f} / {row[f'{name}_p99_ms']:.2f}"


def _cells(r: dict[str, float]) -> list[str]:
    return [
        f"{r['itl_ms']:g}", f"{r['concurrency']:g}", f"{r['direct_rps']:.0f}",
        f"{r['floor_rps']:.0f}", f"{r['gateway_rps']:.0f}", f"{r['ratio']:.2f}",
        f"{r['floor_cpu_us_per_request']:.0f}", f"{r['gateway_cpu_us_per_request']:.0f}",
        _above_floor_cell(r), f"{r['gateway_floor_cpu_ratio']:.2f}",
        _pair(r, "ttft_direct"), _pair(r, "ttft_gateway"), _pair(r, "added_ttft"),
        _pair(r, "floor_added_ttft"), f"{r['gateway_plain_cpu_us_per_request']:.0f}",
        f"{r['plain_above_floor_us']:.0f}", f"{r['resume_cpu_ratio']:.2f}",
        f"{r['failures']:g}",
    ]  # fmt: skip


def _print_aligned(columns: Sequence[str], cells: list[list[str]]) -> None:
    """A header and rows, each column right-aligned to its widest cell."""
    table = [list(columns), *cells]
    widths = [max(len(line[i]) for line in table) for i in range(len(columns))]
    for line in table:
        print("  ".join(cell.rjust(width) for cell, width in zip(line, widths, strict=True)))


def _cpu_aims() -> str:
    return " and ".join(
        f"floor + {us:g} us at {itl:g} ms ITL" for itl, us in ABOVE_FLOOR_US.items()
    )


def print_table(table_rows: list[dict[str, float]]) -> None:
    _print_aligned(COLUMNS, [_cells(r) for r in table_rows])
    print(
        "CPU us per streamed request on the relay's core, TTFT in ms. Aims at every concurrency:"
        f" the resumable gateway (native relay) at most {_cpu_aims()} (gw above floor = gw minus"
        " floor CPU), TTFT p99 no worse than vllm-router's (next table). floor = verbatim byte"
        " relay (loadtest.bench.overhead.floor_relay) pinned like the gateway: the least a Python"
        " relay pays per request, so what the gateway spends above it is its own work. plain ="
        " [resume] off, for information. Added TTFT = relay minus direct percentile. Load:"
        " loadtest.gen closed loop, one worker per stream in flight, workers start spread over"
        " one stream's duration (--lockstep: all at once)."
    )


RELAY_COLUMNS = (
    "ITL ms", "c", "nginx", "router", "floor", "gw native", "gw python", "plain native",
    "plain python", "native/router", "python/router", "plain native/nginx", "plain python/nginx",
    "TTFT p99 native / python / router (aim)",
)  # fmt: skip


def _relay_cells(r: dict[str, float]) -> list[str]:
    meets = r["meets_ttft_p99_aim"]
    aim = "" if math.isnan(meets) else f" {'ok' if meets else 'MISS'}"
    return [
        f"{r['itl_ms']:g}", f"{r['concurrency']:g}",
        f"{r['nginx_cpu_us_per_request']:.0f}", f"{r['router_cpu_us_per_request']:.0f}",
        f"{r['floor_cpu_us_per_request']:.0f}", f"{r['gateway_cpu_us_per_request']:.0f}",
        f"{r['gateway_py_cpu_us_per_request']:.0f}",
        f"{r['gateway_plain_cpu_us_per_request']:.0f}",
        f"{r['gateway_plain_py_cpu_us_per_request']:.0f}",
        f"{r['gateway_router_cpu_ratio']:.2f}", f"{r['gateway_py_router_cpu_ratio']:.2f}",
        f"{r['plain_nginx_cpu_ratio']:.2f}", f"{r['plain_py_nginx_cpu_ratio']:.2f}",
        f"{r['ttft_gateway_p99_ms']:.1f} / {r['gateway_py_ttft_p99_ms']:.1f}"
        f" / {r['router_ttft_p99_ms']:.1f}{aim}",
    ]  # fmt: skip


def print_relays(table_rows: list[dict[str, float]]) -> None:
    """The relays side by side: CPU us per streamed request, their ratios, TTFT p99's aim."""
    print()
    _print_aligned(RELAY_COLUMNS, [_relay_cells(r) for r in table_rows])
    print(
        "CPU us per streamed request on the relay's core. gw = resumable streams, plain ="
        " [resume] off; native / python = [upstream] relay. Peers pinned the same way (nan: not"
        " installed); the CPU ratios to them are for information. Aim at every point: native"
        " resumable TTFT p99 <= vllm-router's."
    )


def print_idle(idle: dict[str, float], seconds: float) -> None:
    """Each relay's CPU with no load: at R requests per second it adds 1000 * ms / R us to
    every request's CPU in the tables (the 20 ms rows have the fewest requests per second)."""
    cells = ", ".join(f"{mode} {ms:.1f}" for mode, ms in idle.items())
    print(f"idle CPU, ms per second (all relays idle for {seconds:g} s): {cells}", flush=True)


def machine(pins: Pins | None, cluster: Cluster) -> dict[str, object]:
    affinity = {
        f"{mode}_affinity": sorted(os.sched_getaffinity(relay.pid))
        for mode, relay in cluster.relays.items()
    }
    return machine_facts() | {
        "peer_versions": cluster.versions,
        "pinned": pins is not None,
        "load_cpu": None if pins is None else pins.load,
        "relay_cpu": None if pins is None else pins.relay,
        **affinity,
    }


def _by_itl(values: dict[float, float] | dict[float, int]) -> dict[str, float]:
    """JSON keys must be strings; "itl_20ms" reads better than "20.0"."""
    return {f"itl_{itl:g}ms": v for itl, v in values.items()}


def write_json(
    out: Path,
    machine_info: dict[str, object],
    counts: dict[float, int],
    lockstep: bool,
    summary: list[dict[str, float]],
    runs: Sequence[Run],
) -> None:
    targets = {"above_floor_us": _by_itl(ABOVE_FLOOR_US), "ttft_p99": TTFT_P99_AIM}
    raw = [
        asdict(r) | {"rps": r.rps, "relay_cpu_us_per_request": r.relay_cpu_us_per_request}
        for r in runs
    ]
    report = {
        "machine": machine_info | {"loadavg_at_end": os.getloadavg()},
        "requests_per_run": _by_itl(counts),
        "lockstep": lockstep,
        "targets": targets,
        "summary": summary,
        "runs": raw,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "overhead.json").write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
    print(f"wrote {out / 'overhead.json'}")
