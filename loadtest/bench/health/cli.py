"""The command line and the top level: pin, run the scale and the detection parts, report."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import loadtest.bench.health
from loadtest.bench.health import detect, real, report, scale
from loadtest.bench.health.observe import wait_quiet
from loadtest.bench.processes import Pins, pin_cpus

T = TypeVar("T")
QUIET_BELOW_CORES = 0.15  # the whole machine, this harness included


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m loadtest.bench.health",
        description=loadtest.bench.health.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", type=Path, required=True, help="write DIR/health.json")
    p.add_argument("--quick", action="store_true", help="short window, few trials: a smoke run")
    p.add_argument("--window", type=float, help="seconds of CPU measured (default 30, quick 10)")
    p.add_argument("--trials", type=int, help="kill and freeze trials each (default 10, quick 3)")
    p.add_argument("--units", type=int, default=1000, help="units probed in the scale part")
    p.add_argument("--followers", type=int, default=3, help="followers per unit (scale part)")
    p.add_argument("--seed", type=int, default=1, help="fault phases of the detection part")
    p.add_argument(
        "--real-trials",
        type=int,
        metavar="N",
        help="kill and freeze runs each on make run's own units (config.toml) with streams"
        " running (default 20, quick 0: skipped)",
    )
    p.add_argument("--real-only", action="store_true", help="only the part on make run's own units")
    p.add_argument(
        "--real-faults",
        default="freeze,kill",
        help="the faults of that part, comma-separated (default freeze,kill)",
    )
    p.add_argument(
        "--wait-quiet",
        type=float,
        default=120.0,
        metavar="S",
        help="before each part wait up to S s for 5 quiet seconds (machine shared); 0 = no",
    )
    args = p.parse_args(argv)
    if args.window is None:
        args.window = 10.0 if args.quick else 30.0
    if args.trials is None:
        args.trials = 3 if args.quick else 10
    if args.real_trials is None:
        args.real_trials = 0 if args.quick and not args.real_only else 20
    if not 0 <= args.real_trials <= 100:
        p.error("--real-trials must be in [0, 100]")
    args.real_faults = tuple(f for f in args.real_faults.split(",") if f)
    if not set(args.real_faults) <= set(real.FAULTS):
        p.error(f"--real-faults must name some of {', '.join(real.FAULTS)}")
    if not 1.0 <= args.window <= 600.0 or not 1 <= args.trials <= 100:
        p.error("--window must be in [1, 600] s and --trials in [1, 100]")
    if not 0.0 <= args.wait_quiet <= 3600.0:
        p.error("--wait-quiet must be in [0, 3600] s")
    if args.units < 1 or args.followers < 0:
        p.error("--units must be >= 1 and --followers >= 0")
    return args


def _pin() -> Pins | None:
    pins = pin_cpus()
    if pins is None:
        print("note: fewer than 2 CPUs available, running unpinned", file=sys.stderr)
        return None
    os.sched_setaffinity(0, {pins.load})  # the simulators inherit this
    print(f"pinned: gateways on CPU {pins.relay}, simulators and this harness on CPU {pins.load}")
    return pins


def _part(
    name: str, args: argparse.Namespace, out: dict[str, Any], run: Callable[[], T]
) -> T | None:
    """One part failing (a process died, a deadline passed) must not hide the other's numbers."""
    errors: dict[str, str] = out["errors"]
    if args.wait_quiet > 0:
        quiet = wait_quiet(args.wait_quiet, QUIET_BELOW_CORES)
        out["quiet_before"][name] = quiet
        if not quiet["quiet"]:
            report.loud(f"machine not quiet after {quiet['waited_s']} s; running {name} anyway")
        else:
            print(f"machine quiet for 5 s (waited {quiet['waited_s']} s)", flush=True)
    started = time.monotonic()
    print(f"running {name} ...", flush=True)
    try:
        result = run()
    except (RuntimeError, OSError, ValueError, KeyError) as exc:
        errors[name] = f"{type(exc).__name__}: {exc}"
        report.loud(f"{name} FAILED: {errors[name]}")
        return None
    print(f"{name} done in {time.monotonic() - started:.0f} s", flush=True)
    return result


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    available = sorted(os.sched_getaffinity(0))
    pins = _pin()
    out: dict[str, Any] = {
        "machine": report.machine(pins) | {"affinity_available": available},
        "args": vars(args) | {"out": str(args.out)},
        "quiet_before": {},
    }
    errors: dict[str, str] = {}
    out["errors"] = errors
    misses: list[str] = []
    warnings: list[str] = []
    with tempfile.TemporaryDirectory(prefix="unitgate-bench-health-") as tmp:
        where = Path(tmp)
        (where / "scale").mkdir()
        (where / "detect").mkdir()
        (where / "real").mkdir()
        s = t = r = None
        if not args.real_only:
            s = _part(
                "prober scale",
                args,
                out,
                lambda: scale.run(where / "scale", pins, args.units, args.followers, args.window),
            )
            t = _part(
                "detection",
                args,
                out,
                lambda: detect.run(where / "detect", pins, args.trials, args.seed),
            )
        if args.real_trials:
            os.sched_setaffinity(0, set(available))  # real units: the whole machine, as make run
            r = _part(
                "detection on make run's units",
                args,
                out,
                lambda: real.run(where / "real", args.real_trials, args.seed, args.real_faults),
            )
    if s is not None:
        rows = report.scale_rows(s, misses)
        report.print_scale(s, rows)
        out["scale"] = s.to_json()
        print(report.start_up(s))
        if s.flips_window or s.flips_settling:
            report.loud(
                f"HEALTH FLIPS with no fault injected: {s.flips_window} in the window,"
                f" {s.flips_settling} while settling before it; reasons {s.flip_reasons}."
                f" {report.flip_onset(s)}"
            )
        if s.scrape_flips:
            report.loud(
                f"FINDING: one /metrics scrape ({s.scrape_s * 1000:.0f} ms) was followed by"
                f" {s.scrape_flips:g} health flips and {s.scrape_failures:g} probe failures"
            )
        warnings += report.busy(s.cores)
    if t is not None:
        detect_rows = report.detect_rows(t, misses)
        report.print_detect(t, detect_rows)
        out["detection"] = t.to_json()
        warnings += report.busy(t.cores)
    if r is not None:
        report.print_real(r, report.real_rows(r, misses))
        out["real"] = r.to_json()
    out["targets"] = {
        "prober_cores_max": report.TARGET_PROBER_CORES,
        "probe_rate_min_share": report.MIN_PROBE_RATE_SHARE,
        "kill_detection_max_s": report.TARGET_KILL_S,
        "freeze_detection_max_s": report.TARGET_FREEZE_S,
        "real_detection_max_s": report.TARGET_REAL_S,
    }
    out |= {"misses": misses, "errors": errors, "machine_busy": warnings}
    for warning in warnings:
        report.loud(f"MACHINE BUSY, numbers skewed: {warning}")
    print(f"\nwrote {report.write_json(args.out, out)}")
    if misses or errors:
        report.loud(f"FAILED: missed {misses or 'nothing'}; errors {list(errors) or 'none'}")
        return 1
    print("all targets met")
    return 0


if __name__ == "__main__":
    sys.exit(main())
