"""`python -m loadtest.bench.ab`: a change against a base revision, in one run.

The gateway of a git revision (`--base`, checked out in a temporary worktree) and the gateway of
this working tree run side by side over the same simulated units, each pinned to the relay's
core; the load runs in this process on the other core. Rounds alternate between the two (A B,
B A, ...), and each round reads the gateway's CPU per request from /proc, so the machine's
drift between rounds falls on both. The summary gives each side's median and the ratio of
this tree to the base, round by round and overall:

    python -m loadtest.bench.ab --base HEAD~1 --itl 0 --concurrency 32 --requests 2000
    python -m loadtest.bench.ab --base main --itl 20 --concurrency 128 --requests 600 --resume off

`--base floor` puts the overhead benchmark's floor relay (bytes verbatim, nothing per request)
in the base's place: the relay aims are set against it (floor + 150 us a request at 0 ms
between tokens, floor + 600 us at 20 ms), and alternating rounds judge them through one run's
drift, which a table of separate runs cannot:

    python -m loadtest.bench.ab --base floor --itl 0 --concurrency 32 --requests 3000

`--idle S` first measures both gateways with no load for S seconds: their CPU per second
(user and system), the work of their background timers (probes, the loop-lag timer).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import uvloop

from loadtest.bench.overhead.load import closed_loop
from loadtest.bench.overhead.params import TOKENS
from loadtest.bench.processes import (
    CLK_TCK,
    child,
    cpu_ticks,
    cpu_times,
    gateway_toml,
    pin_cpus,
    pinned,
)
from loadtest.gen.client import open_session

ROOT = Path(__file__).resolve().parents[2]
SIDES = ("base", "this")
LABELS = ("base", "this tree")
FLOOR = "floor"


def sides_parser(prog: str, doc: str | None) -> argparse.ArgumentParser:
    """The arguments every side-by-side benchmark takes (this one, `bench instructions`):
    the base, and the closed loop's point (between tokens, at once, resumable or not)."""
    p = argparse.ArgumentParser(
        prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--base",
        default="HEAD",
        help=f"the git revision to compare against, or {FLOOR!r}: the floor relay",
    )
    p.add_argument("--itl", type=float, default=0.0, help="ms between tokens")
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--resume", choices=("on", "off"), default="on")
    return p


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = sides_parser("python -m loadtest.bench.ab", __doc__)
    p.add_argument("--requests", type=int, default=2000, help="per round and side")
    p.add_argument("--rounds", type=int, default=5, help="measured rounds per side")
    p.add_argument("--idle", type=float, default=0.0, help="seconds of idle CPU to read first")
    args = p.parse_args(argv)
    for name in ("concurrency", "requests", "rounds"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1, not {getattr(args, name)}")
    if args.itl < 0 or args.idle < 0:
        p.error("--itl and --idle must not be negative")
    return args


@contextlib.contextmanager
def worktree(rev: str) -> Iterator[Path]:
    """`rev` checked out (detached) in a temporary worktree of this repository."""
    with tempfile.TemporaryDirectory(prefix="bench-ab-base-") as tmp:
        path = Path(tmp) / "tree"
        git = ["git", "-C", str(ROOT)]
        done = subprocess.run(
            [*git, "worktree", "add", "--detach", "--quiet", str(path), rev],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise SystemExit(f"bench ab: no worktree of {rev!r}: {done.stderr.strip()}")
        try:
            yield path
        finally:
            subprocess.run([*git, "worktree", "remove", "--force", str(path)], check=False)


async def rounds(
    urls: dict[str, str],
    pids: dict[str, int],
    args: argparse.Namespace,
    sides: tuple[str, str] = SIDES,
) -> dict[str, list[float]]:
    """CPU us per request of each side, round by round (sides alternating in order); `args`
    carries itl, concurrency, requests and rounds."""
    spread = TOKENS * args.itl / 1e3
    cpu: dict[str, list[float]] = {side: [] for side in sides}
    async with open_session(args.concurrency) as session:
        for side in sides:  # warm-up: connections, caches, the first answers
            await closed_loop(session, (urls[side],), 2 * args.concurrency, args.concurrency, 0.0)
        for n in range(args.rounds):
            for side in sides if n % 2 == 0 else sides[::-1]:
                before = cpu_ticks(pids[side])
                loop = await closed_loop(
                    session, (urls[side],), args.requests, args.concurrency, spread
                )
                ticks = cpu_ticks(pids[side]) - before
                failed = sum(1 for r in loop.records if not r.ok)
                if failed:
                    raise SystemExit(f"{failed} requests to the {side} gateway failed")
                cpu[side].append(ticks * 1e6 / CLK_TCK / args.requests)
                print(f"round {n + 1} {side}: {cpu[side][-1]:7.0f} us CPU per request")
    return cpu


def _idle(pids: dict[str, int], seconds: float) -> None:
    before = {side: cpu_times(pid) for side, pid in pids.items()}
    time.sleep(seconds)
    for side, pid in pids.items():
        user, system = (
            (b - a) * 1e3 / CLK_TCK / seconds
            for a, b in zip(before[side], cpu_times(pid), strict=True)
        )
        print(f"idle {side}: user {user:.2f} + system {system:.2f} ms CPU per second")


def report(
    cpu: dict[str, list[float]], sides: tuple[str, str] = SIDES, labels: tuple[str, str] = LABELS
) -> None:
    """Each side's median, the second's ratio to the first and its CPU above the first,
    overall and round by round."""
    first, second = sides
    a, b = (statistics.median(cpu[side]) for side in sides)
    rounds = list(zip(cpu[first], cpu[second], strict=True))
    ratios = " ".join(f"{y / max(x, 1e-9):.3f}" for x, y in rounds)
    above = statistics.median(y - x for x, y in rounds)
    each = " ".join(f"{y - x:+.0f}" for x, y in rounds)
    print(f"\n| gateway | CPU us per request (median of {len(cpu[first])}) |")
    print("|---|---:|")
    print(f"| {labels[0]} | {a:,.0f} |\n| {labels[1]} | {b:,.0f} |")
    print(f"\n{labels[1]} / {labels[0]}: {b / max(a, 1e-9):.3f} (round by round: {ratios})")
    print(f"{labels[1]} - {labels[0]}: {above:+,.0f} us a request (round by round: {each})")


@contextlib.contextmanager
def base_tree(base: str) -> Iterator[Path | None]:
    """The base revision's worktree; None for the floor relay, which runs from this tree."""
    if base == FLOOR:
        yield None
    else:
        with worktree(base) as path:
            yield path


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    pins = pin_cpus()
    relay_cpu = None if pins is None else pins.relay
    with (
        base_tree(args.base) as base,
        tempfile.TemporaryDirectory(prefix="bench-ab-") as tmp_name,
        pinned(None if pins is None else pins.load),
        contextlib.ExitStack() as stack,
    ):
        tmp = Path(tmp_name)
        sim_argv = ["loadtest.simunits", "--units", "2", "--followers", "0", "--ttft-ms", "0"]
        sim_argv += ["--itl-ms", f"{args.itl:g}", "--tokens", str(TOKENS)]
        sim = stack.enter_context(
            child(
                [*sim_argv, "--ready-file", str(tmp / "sim.json")],
                tmp / "sim.json",
                None,
                "simulator",
            )
        )
        (tmp / "gw.toml").write_text(gateway_toml(sim["units"], resume=args.resume == "on"))
        urls, pids = {}, {}
        for side, tree in zip(SIDES, (base, ROOT), strict=True):
            ready = tmp / f"{side}.json"
            argv = ["--config", str(tmp / "gw.toml"), "--ready-file", str(ready)]
            if tree is None:  # the floor relay reads the units from the gateway's config
                argv, gateway = ["loadtest.bench.overhead.floor_relay", *argv], False
            else:
                argv, gateway = ["gateway", "gateway", *argv, "--log-level", "warning"], True
            info = stack.enter_context(child(argv, ready, relay_cpu, side, gateway, tree or ROOT))
            urls[side], pids[side] = info["public"], int(info["pid"])
        if args.idle:
            _idle(pids, args.idle)
        cpu = uvloop.run(rounds(urls, pids, args))
    report(cpu, labels=(FLOOR, LABELS[1]) if base is None else LABELS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
