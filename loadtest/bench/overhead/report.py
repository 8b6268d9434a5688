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

# Targets for a 64-token stream at c=128, keyed by inter-token delay (ms).
TARGET_CPU_US = {0.0: 400.0, 20.0: 1500.0}
# The aims against the peers, at every point: resumable relay / vllm-router CPU, and plain
# relay / nginx CPU; and TTFT p99 no worse than vllm-router's.
TARGET_ROUTER_RATIO = 0.9
TARGET_NGINX_RATIO = 1.0
TARGET_ADDED_TTFT_P50_MS = 1.0
COLUMNS = (
    "ITL ms", "c", "direct/s", "floor/s", "gw/s", "gw/direct", "floor CPU us/req",
    "gw CPU us/req (target)", "gw/floor CPU", "TTFT direct p50/p99", "TTFT gw p50/p99",
    "added TTFT p50/p99 (target p50)", "floor added TTFT p50/p99", "resume off CPU us/req",
    "resume cost", "nginx CPU", "router CPU", "gw/router (aim)", "plain/nginx (aim)", "fail",
)  # fmt: skip


def _pct(values: Sequence[float], q: float) -> float:
    """loadtest.gen's nearest rank, so a reported percentile is a latency some request saw."""
    return percentile(sorted(values), q) if values else math.nan


def _ratio(a: float, b: float) -> float:
    return a / b if b else math.nan


def _compare(runs: dict[str, Run]) -> dict[str, float]:
    """Added TTFT is a difference of percentiles: requests of two modes are not paired."""
    direct, floor, plain, gw = (runs[mode] for mode in MODES)
    row: dict[str, float] = {"itl_ms": gw.itl_ms, "concurrency": gw.concurrency}
    row |= {"direct_rps": direct.rps, "floor_rps": floor.rps, "gateway_rps": gw.rps}
    row["ratio"] = _ratio(gw.rps, direct.rps)
    floor_cpu, gw_cpu = floor.relay_cpu_us_per_request, gw.relay_cpu_us_per_request
    row |= {"floor_cpu_us_per_request": floor_cpu, "gateway_cpu_us_per_request": gw_cpu}
    row["gateway_floor_cpu_ratio"] = _ratio(gw_cpu, floor_cpu)
    for q, name in ((50, "p50"), (99, "p99")):
        d, f, g = (_pct(r.ttft_ms, q) for r in (direct, floor, gw))
        row |= {f"ttft_direct_{name}_ms": d, f"ttft_floor_{name}_ms": f}
        row[f"ttft_gateway_{name}_ms"] = g
        row |= {f"added_ttft_{name}_ms": g - d, f"floor_added_ttft_{name}_ms": f - d}
    plain_cpu = plain.relay_cpu_us_per_request
    row["gateway_plain_cpu_us_per_request"] = plain_cpu
    row["resume_cpu_ratio"] = _ratio(gw_cpu, plain_cpu)  # what tracking for resumption costs
    nginx, router = runs.get("nginx"), runs.get("vllm-router")
    nginx_cpu = nginx.relay_cpu_us_per_request if nginx else math.nan
    router_cpu = router.relay_cpu_us_per_request if router else math.nan
    row |= {"nginx_cpu_us_per_request": nginx_cpu, "router_cpu_us_per_request": router_cpu}
    row["gateway_router_cpu_ratio"] = _ratio(gw_cpu, router_cpu)
    row["plain_nginx_cpu_ratio"] = _ratio(plain_cpu, nginx_cpu)
    for mode in PYTHON_MODES:
        run = runs.get(mode)
        key = mode.replace("-", "_")
        row[f"{key}_cpu_us_per_request"] = run.relay_cpu_us_per_request if run else math.nan
        row[f"{key}_ttft_p99_ms"] = _pct(run.ttft_ms, 99) if run else math.nan
    row["gateway_py_router_cpu_ratio"] = _ratio(row["gateway_py_cpu_us_per_request"], router_cpu)
    row["plain_py_nginx_cpu_ratio"] = _ratio(row["gateway_plain_py_cpu_us_per_request"], nginx_cpu)
    row |= _room(floor_cpu, gw_cpu, plain_cpu, router_cpu, nginx_cpu)
    row["router_ttft_p99_ms"] = _pct(router.ttft_ms, 99) if router else math.nan
    row["nginx_ttft_p99_ms"] = _pct(nginx.ttft_ms, 99) if nginx else math.nan
    row["failures"] = sum(run.failures for run in runs.values())
    return row


def _room(
    floor: float, gateway: float, plain: float, router: float, nginx: float
) -> dict[str, float]:
    """What each aim leaves a relay above the floor relay, in CPU us per request, and what the
    gateway spends there. The floor forwards bytes and does nothing per request, so an aim
    whose room is near zero or below it asks for less than any relay with per-request work
    (parsing, admission, routing, metering) can pay on the same event loop."""
    return {
        "router_aim_room_us": TARGET_ROUTER_RATIO * router - floor,
        "nginx_aim_room_us": TARGET_NGINX_RATIO * nginx - floor,
        "gateway_above_floor_us": gateway - floor,
        "plain_above_floor_us": plain - floor,
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


def _verdict(value: float, target: float) -> str:
    return f"(<={target:g} {'ok' if value <= target else 'MISS'})"


def _aim(ratio: float, target: float) -> str:
    return "-" if math.isnan(ratio) else f"{ratio:.2f} {_verdict(ratio, target)}"


def _pair(row: dict[str, float], name: str) -> str:
    return f"{row[f'{name}_p50_ms']:.2f} / {row[f'{name}_p99_ms']:.2f}"


def _cells(r: dict[str, float]) -> list[str]:
    cpu, added = r["gateway_cpu_us_per_request"], r["added_ttft_p50_ms"]
    return [
        f"{r['itl_ms']:g}", f"{r['concurrency']:g}", f"{r['direct_rps']:.0f}",
        f"{r['floor_rps']:.0f}", f"{r['gateway_rps']:.0f}", f"{r['ratio']:.2f}",
        f"{r['floor_cpu_us_per_request']:.0f}",
        f"{cpu:.0f} {_verdict(cpu, TARGET_CPU_US[r['itl_ms']])}",
        f"{r['gateway_floor_cpu_ratio']:.2f}",
        _pair(r, "ttft_direct"), _pair(r, "ttft_gateway"),
        f"{_pair(r, 'added_ttft')} {_verdict(added, TARGET_ADDED_TTFT_P50_MS)}",
        _pair(r, "floor_added_ttft"), f"{r['gateway_plain_cpu_us_per_request']:.0f}",
        f"{r['resume_cpu_ratio']:.2f}", f"{r['nginx_cpu_us_per_request']:.0f}",
        f"{r['router_cpu_us_per_request']:.0f}",
        _aim(r["gateway_router_cpu_ratio"], TARGET_ROUTER_RATIO),
        _aim(r["plain_nginx_cpu_ratio"], TARGET_NGINX_RATIO),
        f"{r['failures']:g}",
    ]  # fmt: skip


def _print_aligned(columns: Sequence[str], cells: list[list[str]]) -> None:
    """A header and rows, each column right-aligned to its widest cell."""
    table = [list(columns), *cells]
    widths = [max(len(line[i]) for line in table) for i in range(len(columns))]
    for line in table:
        print("  ".join(cell.rjust(width) for cell, width in zip(line, widths, strict=True)))


def print_table(table_rows: list[dict[str, float]]) -> None:
    _print_aligned(COLUMNS, [_cells(r) for r in table_rows])
    print(
        f"TTFT in ms. Targets for 64-token streams at c=128: gateway CPU <= {TARGET_CPU_US[0.0]:g}"
        f" us/request at 0 ms ITL and <= {TARGET_CPU_US[20.0]:g} us at 20 ms ITL;"
        f" added TTFT p50 <= {TARGET_ADDED_TTFT_P50_MS:g} ms. Added TTFT = relay minus direct"
        " percentile. floor = verbatim byte relay (loadtest.bench.overhead.floor_relay) pinned"
        " like the gateway: the least a Python relay pays per request, so gw/floor CPU is what the"
        " gateway's own work costs. Load: loadtest.gen closed loop, one worker per stream in"
        " flight, workers start spread over one stream's duration (--lockstep: all at once)."
        f" Peers pinned the same way (nan: not installed); aims: gateway (resumable) <="
        f" {TARGET_ROUTER_RATIO:g}x vllm-router's CPU and plain <= {TARGET_NGINX_RATIO:g}x"
        " nginx's, at every point."
    )


RELAY_COLUMNS = (
    "ITL ms", "c", "nginx", "router", "floor", "gw native", "gw python", "plain native",
    "plain python", "native/router (aim)", "python/router", "plain native/nginx (aim)",
    "plain python/nginx", "TTFT p99 native / python / router (aim)",
)  # fmt: skip


def _relay_cells(r: dict[str, float]) -> list[str]:
    ttft, router_ttft = r["ttft_gateway_p99_ms"], r["router_ttft_p99_ms"]
    aim = "" if math.isnan(router_ttft) else f" {'ok' if ttft <= router_ttft else 'MISS'}"
    return [
        f"{r['itl_ms']:g}", f"{r['concurrency']:g}",
        f"{r['nginx_cpu_us_per_request']:.0f}", f"{r['router_cpu_us_per_request']:.0f}",
        f"{r['floor_cpu_us_per_request']:.0f}", f"{r['gateway_cpu_us_per_request']:.0f}",
        f"{r['gateway_py_cpu_us_per_request']:.0f}",
        f"{r['gateway_plain_cpu_us_per_request']:.0f}",
        f"{r['gateway_plain_py_cpu_us_per_request']:.0f}",
        _aim(r["gateway_router_cpu_ratio"], TARGET_ROUTER_RATIO),
        f"{r['gateway_py_router_cpu_ratio']:.2f}",
        _aim(r["plain_nginx_cpu_ratio"], TARGET_NGINX_RATIO),
        f"{r['plain_py_nginx_cpu_ratio']:.2f}",
        f"{ttft:.1f} / {r['gateway_py_ttft_p99_ms']:.1f} / {router_ttft:.1f}{aim}",
    ]  # fmt: skip


def print_relays(table_rows: list[dict[str, float]]) -> None:
    """The relays side by side: CPU us per streamed request, the aims' ratios, TTFT p99."""
    print()
    _print_aligned(RELAY_COLUMNS, [_relay_cells(r) for r in table_rows])
    print(
        "CPU us per streamed request on the relay's core. gw = resumable streams, plain ="
        " [resume] off; native / python = [upstream] relay. Aims at every point: native"
        f" resumable <= {TARGET_ROUTER_RATIO:g}x vllm-router, native plain <="
        f" {TARGET_NGINX_RATIO:g}x nginx, TTFT p99 <= vllm-router's."
    )


ROOM_COLUMNS = (
    "ITL ms", "c", "floor", "room under the resumable aim", "resumable native above floor",
    "room under the plain aim", "plain native above floor",
)  # fmt: skip


def _room_cells(r: dict[str, float]) -> list[str]:
    return [
        f"{r['itl_ms']:g}", f"{r['concurrency']:g}", f"{r['floor_cpu_us_per_request']:.0f}",
        f"{r['router_aim_room_us']:.0f}", f"{r['gateway_above_floor_us']:.0f}",
        f"{r['nginx_aim_room_us']:.0f}", f"{r['plain_above_floor_us']:.0f}",
    ]  # fmt: skip


def print_room(table_rows: list[dict[str, float]]) -> None:
    """Each aim as room above the floor relay: what a relay may spend on its own work."""
    print()
    _print_aligned(ROOM_COLUMNS, [_room_cells(r) for r in table_rows])
    print(
        "CPU us per streamed request. Room = the aim's CPU (resumable: "
        f"{TARGET_ROUTER_RATIO:g}x vllm-router's; plain: {TARGET_NGINX_RATIO:g}x nginx's) minus"
        " the floor relay's, which forwards bytes and does nothing per request: what the aim"
        " leaves for parsing, admission, routing and metering (nan: peer not installed)."
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
    targets = {
        "cpu_us_at_c128": _by_itl(TARGET_CPU_US),
        "added_ttft_p50_ms": TARGET_ADDED_TTFT_P50_MS,
    }
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
