"""The command line and the order of the phases: the unit up, probed idle, then saturated."""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import loadtest.bench.leader_health
from loadtest.bench.leader_health import report
from loadtest.bench.leader_health.probe import DEADLINE_S, Probe, Prober
from loadtest.bench.leader_health.unit import MODEL, Pins, Unit, pins, running_unit
from loadtest.bench.processes import pinned

SATURATE_WITHIN_S = 30.0
REQUEST_TIMEOUT_S = 60.0  # a queued request waits behind (concurrency / slots) answers


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m loadtest.bench.leader_health",
        description=loadtest.bench.leader_health.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", type=Path, required=True, help="DIR/leader_health.json, DIR/logs/")
    p.add_argument("--idle", type=float, default=5.0, help="seconds probed with no load")
    p.add_argument("--window", type=float, default=20.0, help="seconds probed under load")
    p.add_argument("--rate", type=float, default=15.0, help="probes per second per endpoint")
    p.add_argument("--concurrency", type=int, default=96, help="streams kept in flight")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--num-slots", type=int, default=8, help="the leader's KV slots")
    p.add_argument("--no-pin", action="store_true", help="leave CPU placement to the OS")
    p.add_argument("--start-timeout", type=float, default=90.0, help="seconds for the unit")
    args = p.parse_args(argv)
    if not (0.5 <= args.idle <= 120 and 1 <= args.window <= 120 and 1 <= args.rate <= 50):
        p.error("--idle must be in [0.5, 120] s, --window in [1, 120] s, --rate in [1, 50] Hz")
    if args.concurrency < 1 or args.max_tokens < 1 or args.num_slots < 1:
        p.error("--concurrency, --max-tokens and --num-slots must be >= 1")
    return args


def _measure(unit: Unit, seconds: float, rate: float) -> dict[str, list[Probe]]:
    """Both endpoints for `seconds`, alternating: the thread's probes half a period later."""
    probers = {
        "api": Prober(unit.api_port, rate),
        "thread": Prober(unit.health_port, rate, offset_s=0.5 / rate),
    }
    for prober in probers.values():
        prober.start()
    time.sleep(seconds)  # the measuring window itself, not a wait for something to happen
    return {name: prober.stop() for name, prober in probers.items()}


@contextlib.contextmanager
def _load(
    unit: Unit, args: argparse.Namespace, cpu: int | None, logs: Path
) -> Iterator[subprocess.Popen[bytes]]:
    """The project's load generator, closed loop, bounded in time and count; stopped once the
    window is over (its own report is not needed: the leader's answers show the load)."""
    duration = SATURATE_WITHIN_S + args.window
    argv = ["--url", f"http://127.0.0.1:{unit.api_port}", "--model", MODEL, "--ignore-eos"]
    argv += ["--concurrency", str(args.concurrency), "--max-tokens", str(args.max_tokens)]
    argv += ["--duration", f"{duration:g}", "--requests", str(args.concurrency * 50)]
    argv += ["--timeout", f"{REQUEST_TIMEOUT_S:g}", "--no-progress", "--out", str(logs / "load")]
    with (logs / "load.log").open("wb") as log, pinned(cpu):
        proc = subprocess.Popen(
            [sys.executable, "-m", "loadtest", *argv], stdout=log, stderr=subprocess.STDOUT
        )
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def _wait_saturated(unit: Unit, args: argparse.Namespace, load: subprocess.Popen[bytes]) -> float:
    """Seconds until requests queue at the leader (pending above its slots, or every stream
    in flight when there are fewer streams than slots)."""
    want = min(args.concurrency, args.num_slots + 1)
    started = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", unit.health_port, timeout=2.0)
    try:
        while time.monotonic() - started < SATURATE_WITHIN_S:
            if load.poll() is not None:
                raise RuntimeError(f"the load generator exited with {load.returncode}")
            conn.request("GET", "/health")
            if json.loads(conn.getresponse().read()).get("pending", 0) >= want:
                return time.monotonic() - started
            time.sleep(0.1)
    finally:
        conn.close()
    raise RuntimeError(f"fewer than {want} requests pending after {SATURATE_WITHIN_S:g} s")


def _run(args: argparse.Namespace, cpus: Pins | None, logs: Path) -> dict[str, Any]:
    rest = None if cpus is None else cpus.rest
    with running_unit(logs, args.num_slots, cpus, args.start_timeout) as unit:
        print(f"unit up: API :{unit.api_port}, leader /health thread :{unit.health_port}")
        idle = _measure(unit, args.idle, args.rate)
        with _load(unit, args, rest, logs) as load:
            ramp = _wait_saturated(unit, args, load)
            print(f"saturated after {ramp:.1f} s; probing for {args.window:g} s", flush=True)
            saturated = _measure(unit, args.window, args.rate)
    phases = {"idle": idle, "saturated": saturated}
    return {
        "phases": {
            phase: {name: report.summarize(probes) for name, probes in by.items()}
            for phase, by in phases.items()
        },
        "leader_load": report.load_evidence(saturated["thread"], args.window),
        "ramp_s": round(ramp, 2),
    }


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    cpus = None if args.no_pin else pins()
    if cpus is not None:
        os.sched_setaffinity(0, {cpus.rest})  # this prober; the leader is pinned at its start
        print(f"pinned: leader on CPU {cpus.leader}; follower, load and prober on {cpus.rest}")
    logs = args.out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = {
        "machine": report.machine() | report.placement(cpus),
        "args": vars(args) | {"out": str(args.out)},
        "probe_deadline_s": DEADLINE_S,
        "gateway_probe_timeout_s": report.PROBE_TIMEOUT_S,
    }
    try:
        out |= _run(args, cpus, logs)
    except (RuntimeError, OSError, ValueError) as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
        print(f"FAILED: {out['error']} (logs in {logs})", file=sys.stderr)
        report.write_json(args.out, out)
        return 1
    print(report.table(out["phases"]))
    print(report.describe_load(out["leader_load"], args.num_slots))
    print(f"wrote {report.write_json(args.out, out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
