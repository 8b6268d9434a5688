"""`python -m loadtest.bench.burst`: thousands of open streams arriving in full waves.

The setup: simulated units streaming one token a second, one gateway with
probes and breakers on (the defaults: 0.25 s rounds, 0.2 s probe timeout, 5 consecutive
failures), and `loadtest.gen` as a closed loop of N streams, so every N-stream wave starts at
once when the last one ends. Before the fix a 5,000-stream second wave slowed the simulated
leaders' /health past the probe timeout, probes ejected 3 of 4 units, the ejections broke
their flowing streams, the breakers counted those as failures and resumption drained the
retry budget: 2,240 of 10,000 requests ended in an error event.

Reported per N: failed requests by kind, health ejections and breaker trips (the gateway's
events log), slow marks, resumptions, the gateway's idle and peak RSS and RSS per open stream,
and its CPU per relayed token (from /proc). The gateway is pinned to one core, the simulator
and the load generator to the other, as the other benchmarks do; on 2 cores the load
generator and the simulator compete for theirs, which is part of the stress.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gateway.base.readyfile import wait_ready_blocking
from loadtest.bench.processes import (
    CLK_TCK,
    MODEL,
    READY_TIMEOUT_S,
    gateway_toml,
    pin_cpus,
    pinned,
    stop_child,
    tree,
    tree_ticks,
)
from loadtest.readyfile import wait_http_ok

ADMIN = """\
[admin]
enabled = true
state_file = ""
events_kept = 100000
allow_unauthenticated_loopback = false
"""


@dataclass(frozen=True)
class Shape:
    streams: int
    units: int
    tokens: int
    itl_ms: float
    waves: int
    workers: int = 1  # [gateway].workers
    relay: str = "auto"  # [upstream] relay

    @property
    def duration(self) -> float:
        """Seconds of sending: `waves` waves of answers `tokens` x `itl_ms` long."""
        return self.waves * self.tokens * self.itl_ms / 1000


@dataclass
class Point:
    streams: int
    units: int
    tokens: int
    itl_ms: float
    requests: int
    succeeded: int
    failed: int
    errors: dict[str, int]
    ejections: int  # prober `unhealthy` events
    breaker_trips: int  # breaker `ejected` events
    slow_marks: int
    resumptions: float
    max_loop_lag_s: float  # the gateway's own event loop, behind schedule at worst
    itl_p50_ms: float  # as the clients saw it: the units' 1 s plus whatever the load added
    e2e_p50_ms: float
    ejection_reasons: list[str]
    idle_rss_mb: float
    peak_rss_mb: float
    rss_per_stream_kb: float
    output_tokens: int
    gateway_cpu_s: float
    cpu_per_token_us: float
    wall_s: float


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.bench.burst", description=__doc__)
    p.add_argument("--streams", default="5000,10000", help="comma-separated wave sizes")
    p.add_argument("--units", type=int, default=4)
    p.add_argument("--tokens", type=int, default=20, help="tokens per answer")
    p.add_argument("--itl-ms", type=float, default=1000.0, help="gap between tokens")
    p.add_argument("--waves", type=int, default=2, help="full waves per point")
    p.add_argument("--workers", type=int, default=1, help="[gateway].workers")
    p.add_argument(
        "--relay", choices=("auto", "native", "python"), default="auto", help="[upstream] relay"
    )
    p.add_argument("--out", type=Path, help="directory for burst.json")
    args = p.parse_args(argv)
    sizes = [int(s) for s in args.streams.split(",") if s.strip()]
    if not sizes or min(sizes) < 1 or args.units < 1 or args.tokens < 1 or args.waves < 1:
        p.error("--streams, --units, --tokens and --waves must be positive")
    points = [
        run_point(
            Shape(n, args.units, args.tokens, args.itl_ms, args.waves, args.workers, args.relay)
        )
        for n in sizes
    ]
    print(table(points))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "burst.json").write_text(json.dumps([asdict(x) for x in points], indent=2))
        print(f"written to {args.out / 'burst.json'}")
    return 0


def run_point(shape: Shape) -> Point:
    pins = pin_cpus()
    load_cpu, gw_cpu = (None, None) if pins is None else (pins.load, pins.relay)
    with tempfile.TemporaryDirectory(prefix="bench-burst-") as tmp_dir:
        tmp = Path(tmp_dir)
        sim_argv = ["loadtest.simunits", "--units", str(shape.units), "--followers", "1"]
        sim_argv += ["--ttft-ms", "50", "--itl-ms", str(shape.itl_ms)]
        sim_argv += ["--tokens", str(shape.tokens), "--ready-file", str(tmp / "sim.json")]
        with _child(sim_argv, tmp / "sim.json", load_cpu) as (sim, _):
            config = tmp / "gw.toml"
            n = shape.streams
            toml = gateway_toml(
                sim["units"],
                cap=n,
                queue=n,
                admin=ADMIN,
                workers=shape.workers,
                relay=shape.relay,
            )
            config.write_text(toml)
            token = secrets.token_urlsafe(32)
            gw_argv = ["gateway", "gateway", "--config", str(config), "--log-level", "warning"]
            ready = tmp / "gw.json"
            gw_argv += ["--ready-file", str(ready)]
            with _child(gw_argv, ready, gw_cpu, {"UNITGATE_ADMIN_TOKEN": token}) as (gw, proc):
                wait_http_ok(gw["public"] + "/readyz", proc, READY_TIMEOUT_S, "gateway")
                return _measure(shape, gw, token, tmp, load_cpu)
    raise AssertionError("unreachable")


def _measure(
    shape: Shape, gw: dict[str, Any], token: str, tmp: Path, load_cpu: int | None
) -> Point:
    pid, streams = int(gw["pid"]), shape.streams
    idle_rss = _tree_kb(pid, "VmRSS")
    cpu_before, started = tree_ticks(pid), time.monotonic()
    out = tmp / "load"
    argv = [sys.executable, "-m", "loadtest", "--url", gw["public"], "--model", MODEL]
    argv += ["--concurrency", str(streams), "--duration", f"{shape.duration:.1f}"]
    argv += ["--max-tokens", str(shape.tokens), "--timeout", "120"]
    argv += ["--out", str(out), "--no-progress"]
    with pinned(load_cpu):
        load = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
    try:
        load.wait(timeout=shape.duration + 300)
    finally:
        stop_child(load)
    wall = time.monotonic() - started
    cpu_s = (tree_ticks(pid) - cpu_before) / CLK_TCK
    peak_rss = _tree_kb(pid, "VmHWM")
    summary = json.loads((out / "result.json").read_text())["summary"]
    events = _get(gw["metrics"] + "/admin/events?limit=100000", token)["events"]
    whats = [e["what"] for e in events]
    metrics = urllib.request.urlopen(gw["metrics"] + "/metrics", timeout=10).read().decode()
    resumed = sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("unitgate_resumptions_total{")
    )
    lag = next(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("unitgate_event_loop_lag_max_seconds ")
    )
    out_tokens = int(summary["output_tokens"])
    return Point(
        streams=streams,
        units=shape.units,
        tokens=shape.tokens,
        itl_ms=shape.itl_ms,
        requests=int(summary["requests"]),
        succeeded=int(summary["succeeded"]),
        failed=int(summary["failed"]),
        errors=dict(summary["errors"]),
        ejections=whats.count("unhealthy"),
        ejection_reasons=[e["reason"] for e in events if e["what"] == "unhealthy"],
        breaker_trips=whats.count("breaker ejected"),
        slow_marks=whats.count("slow"),
        resumptions=resumed,
        max_loop_lag_s=lag,
        itl_p50_ms=float(summary["itl_ms"]["p50"] or 0.0),
        e2e_p50_ms=float(summary["e2e_ms"]["p50"] or 0.0),
        idle_rss_mb=idle_rss / 1024,
        peak_rss_mb=peak_rss / 1024,
        rss_per_stream_kb=(peak_rss - idle_rss) / streams,
        output_tokens=out_tokens,
        gateway_cpu_s=cpu_s,
        cpu_per_token_us=cpu_s / out_tokens * 1e6 if out_tokens else 0.0,
        wall_s=wall,
    )


@contextlib.contextmanager
def _child(
    argv: list[str], ready: Path, cpu: int | None, env: dict[str, str] | None = None
) -> Iterator[tuple[dict[str, Any], subprocess.Popen[bytes]]]:
    with pinned(cpu):
        proc = subprocess.Popen(
            [sys.executable, "-m", *argv],
            stdout=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
        )
    try:
        yield wait_ready_blocking(ready, proc, READY_TIMEOUT_S, argv[0]), proc
    finally:
        stop_child(proc)


def _tree_kb(pid: int, field: str) -> float:
    """`field` summed over the gateway's processes (with workers, each one's own peak: an
    upper bound on their peak together)."""
    return sum(_status_kb(each, field) for each in tree(pid))


def _status_kb(pid: int, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return float(line.split()[1])
    raise KeyError(field)


def _get(url: str, token: str) -> Any:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def table(points: list[Point]) -> str:
    head = (
        "| open streams | requests | failed | health ejections | breaker trips | slow marks "
        "| resumed | ITL p50 | e2e p50 | gateway loop lag max | RSS idle -> peak "
        "| RSS per stream | gateway CPU per token |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    )
    rows = [
        f"| {x.streams:,} | {x.requests:,} | {x.failed}"
        + (f" ({', '.join(f'{k} {v}' for k, v in x.errors.items())})" if x.errors else "")
        + f" | {x.ejections} | {x.breaker_trips} | {x.slow_marks} | {x.resumptions:g}"
        f" | {x.itl_p50_ms / 1000:.2f} s | {x.e2e_p50_ms / 1000:.1f} s"
        f" | {x.max_loop_lag_s:.2f} s"
        f" | {x.idle_rss_mb:.0f} -> {x.peak_rss_mb:.0f} MB | {x.rss_per_stream_kb:.1f} KB"
        f" | {x.cpu_per_token_us:.0f} us |"
        for x in points
    ]
    return "\n".join([head, *rows])


if __name__ == "__main__":
    sys.exit(main())
