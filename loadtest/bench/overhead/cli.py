"""Flags and the top level: pin, start the processes, run the load, report."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import uvloop

import loadtest.bench.overhead
from loadtest.bench.overhead import report
from loadtest.bench.overhead.cluster import cluster
from loadtest.bench.overhead.load import Run, idle_cpu, run_all
from loadtest.bench.processes import Pins, pin_cpus


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m loadtest.bench.overhead",
        description=loadtest.bench.overhead.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", type=Path, help="write DIR/overhead.json with all raw numbers")
    p.add_argument("--requests-fast", type=int, default=3000, help="per run at 0 ms ITL")
    p.add_argument("--requests-slow", type=int, default=1000, help="per run at 20 ms ITL")
    p.add_argument("--quick", action="store_true", help="small counts: a smoke run")
    p.add_argument(
        "--lockstep", action="store_true", help="start all workers at once (no start spread)"
    )
    args = p.parse_args(argv)
    if args.quick:
        args.requests_fast, args.requests_slow = 300, 150
    if min(args.requests_fast, args.requests_slow) < 1:
        p.error("request counts must be >= 1")
    return args


IDLE_S = 10.0  # how long every relay's idle CPU is read, before the load


def _bench(
    counts: dict[float, int], pins: Pins | None, lockstep: bool
) -> tuple[list[Run], dict[str, object]]:
    with (
        tempfile.TemporaryDirectory(prefix="unitgate-bench-") as tmp,
        cluster(Path(tmp), pins) as procs,
    ):
        machine = report.machine(pins, procs)
        machine["idle_cpu_ms_per_s"] = idle = idle_cpu(procs, IDLE_S)
        report.print_idle(idle, IDLE_S)
        runs: list[Run] = uvloop.run(run_all(procs, counts, lockstep))
    return runs, machine


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    counts = {0.0: args.requests_fast, 20.0: args.requests_slow}
    pins = pin_cpus()
    if pins is None:
        print("note: fewer than 2 CPUs available, running unpinned", file=sys.stderr)
    else:
        os.sched_setaffinity(0, {pins.load})  # the simulator inherits this
        print(
            f"pinned: gateway and floor relay on CPU {pins.relay},"
            f" simulator and load generator on CPU {pins.load}"
        )
    try:
        runs, machine = _bench(counts, pins, args.lockstep)
    except RuntimeError as exc:
        print(f"bench overhead: {exc}", file=sys.stderr)
        return 1
    summary = report.rows(runs)
    report.print_table(summary)
    report.print_relays(summary)
    if args.out is not None:
        report.write_json(args.out, machine, counts, args.lockstep, summary, runs)
    failures = sum(r.failures for r in runs)
    if failures:
        print(f"\n*** {failures} REQUESTS FAILED: these numbers are not valid ***", file=sys.stderr)
        return 1
    return 0
