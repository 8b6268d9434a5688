"""`python -m loadtest.bench.instructions`: a change against a base, in instructions a request.

`bench ab` reads CPU time from /proc, and on this VM a round moves by 15% either way, so a
change worth 10 us a request needs many rounds and still may not show. This counts instead:
each side (this tree, the gateway of a git revision in a temporary worktree, or the floor
relay) runs under valgrind's callgrind over the same simulated units as `bench ab`, with
counting off until it is warm (started, connected, its first answers relayed), then counts the
user-space instructions its process runs over `--requests` requests of `bench ab`'s closed
loop. The count repeats within about 1% (what still varies is how many reads a stream takes
at 0 ms between tokens). It sees neither the kernel nor memory stalls, so it ranks changes to
the gateway's own work; the relay aims, in microseconds, are still `bench ab`'s to judge.

    python -m loadtest.bench.instructions --base HEAD~1
    python -m loadtest.bench.instructions --base floor --top 15

`--top K` lists the K functions (C level: the interpreter, the native relay, libc) that ran
the most instructions on this tree's side. Needs valgrind (Debian's `valgrind`; `make bench`
installs it as root with apt).
"""

from __future__ import annotations

import argparse
import contextlib
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import uvloop

from gateway.base.readyfile import wait_ready_blocking
from loadtest.bench.ab import FLOOR, ROOT, base_tree, sides_parser
from loadtest.bench.overhead.load import closed_loop
from loadtest.bench.overhead.params import TOKENS
from loadtest.bench.processes import child, gateway_toml, stop_child
from loadtest.gen.client import open_session
from loadtest.readyfile import wait_http_ok

# callgrind_annotate's row: count, its share (of a total it may misread), file:function, [lib].
_ROW = re.compile(r"^\s*([\d,]+)\s+\([^)]*\)\s+(\S+:\S+)(?:\s+\[([^\]]+)\])?\s*$")
READY_TIMEOUT_S = 300.0  # a gateway's start under valgrind, counting off: about 10 s here
CONTROL_TIMEOUT_S = 60.0


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = sides_parser("python -m loadtest.bench.instructions", __doc__)
    p.add_argument("--requests", type=int, default=1000, help="counted, per side")
    p.add_argument("--top", type=int, default=0, help="this tree's K costliest functions")
    args = p.parse_args(argv)
    for name in ("requests", "concurrency"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1, not {getattr(args, name)}")
    if args.itl < 0 or args.top < 0:
        p.error("--itl and --top must not be negative")
    return args


def totals(dump: str) -> int:
    """The instructions a callgrind dump counted (its `totals:` line; 0 if it has none)."""
    for line in dump.splitlines():
        if line.startswith("totals:"):
            return int(line.split()[1])
    return 0


def _control(*args: str) -> None:
    subprocess.run(
        ["callgrind_control", *args], check=True, capture_output=True, timeout=CONTROL_TIMEOUT_S
    )


@contextlib.contextmanager
def counted(
    module: list[str], cwd: Path, tmp: Path, gateway: bool
) -> Iterator[tuple[str, int, Path]]:
    """`python -m *module` under callgrind, counting off, once it serves: its public URL, its
    pid and its dump's path (written by `callgrind_control -d`)."""
    ready, out = tmp / "side.json", tmp / "callgrind.out"
    ready.unlink(missing_ok=True)
    argv = [
        "valgrind",
        "--tool=callgrind",
        "--instr-atstart=no",
        f"--callgrind-out-file={out}",
        sys.executable,
        "-m",
        *module,
    ]
    proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        info = wait_ready_blocking(ready, proc, READY_TIMEOUT_S, module[0])
        if gateway:
            wait_http_ok(info["public"] + "/readyz", proc, READY_TIMEOUT_S, module[0])
        yield info["public"], proc.pid, Path(f"{out}.1")
    finally:
        stop_child(proc)


async def _load(url: str, requests: int, concurrency: int, spread: float) -> None:
    async with open_session(concurrency) as session:
        loop = await closed_loop(session, (url,), requests, concurrency, spread, TOKENS)
    failed = sum(1 for r in loop.records if not r.ok)
    if failed:
        raise SystemExit(f"{failed} of {requests} requests failed: the count is not valid")


def measure(
    module: list[str], cwd: Path, tmp: Path, gateway: bool, args: argparse.Namespace
) -> tuple[int, Path]:
    """Instructions a request of one side, and its dump (for `--top`)."""
    spread = TOKENS * args.itl / 1e3
    c = args.concurrency
    with counted(module, cwd, tmp, gateway) as (url, pid, dump):
        uvloop.run(_load(url, 2 * c, c, spread))  # warm: connections, caches, first answers
        _control("--instr=on", str(pid))
        uvloop.run(_load(url, c, c, spread))  # callgrind's own translations warm too
        _control("--zero", str(pid))
        uvloop.run(_load(url, args.requests, c, spread))
        _control("--dump", str(pid))
        kept = tmp / f"dump-{len(list(tmp.glob('dump-*')))}"
        shutil.copy(dump, kept)
    return totals(kept.read_text()) // args.requests, kept


def top(dump: Path, k: int) -> list[str]:
    """The `k` functions of `dump` with the most instructions (callgrind_annotate's rows: the
    count, the source file and function, the library), paths cut to their last part."""
    text = subprocess.run(
        ["callgrind_annotate", "--threshold=100", str(dump)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rows = []
    for line in text.splitlines():
        found = _ROW.match(line)
        if found is not None:
            count, where, lib = found.groups()
            rows.append(
                f"{count:>14} {where.rsplit('/', 1)[-1]} ({(lib or '?').rsplit('/', 1)[-1]})"
            )
    return rows[:k]


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("bench instructions needs valgrind (Debian: apt-get install valgrind)")
    with base_tree(args.base) as base, tempfile.TemporaryDirectory(prefix="bench-instr-") as t:
        tmp = Path(t)
        sim_argv = ["loadtest.simunits", "--units", "2", "--followers", "0", "--ttft-ms", "0"]
        sim_argv += ["--itl-ms", f"{args.itl:g}", "--tokens", str(TOKENS)]
        with child(
            [*sim_argv, "--ready-file", str(tmp / "sim.json")], tmp / "sim.json", None, "simulator"
        ) as sim:
            toml = tmp / "gw.toml"
            toml.write_text(gateway_toml(sim["units"], resume=args.resume == "on"))
            config = ["--config", str(toml), "--ready-file", str(tmp / "side.json")]
            gateway = ["gateway", "gateway", *config, "--log-level", "warning"]
            if base is None:
                first = measure(
                    ["loadtest.bench.overhead.floor_relay", *config], ROOT, tmp, False, args
                )
            else:
                first = measure(gateway, base, tmp, True, args)
            this = measure(gateway, ROOT, tmp, True, args)
            label = FLOOR if base is None else "base"
            print(f"\n| side | instructions a request ({args.requests} requests) |")
            print("|---|---:|")
            print(f"| {label} | {first[0]:,} |\n| this tree | {this[0]:,} |")
            print(f"\nthis tree / {label}: {this[0] / max(first[0], 1):.3f}")
            print(f"this tree - {label}: {this[0] - first[0]:+,} instructions a request")
            if args.top:
                print(f"\nthis tree's {args.top} costliest functions (instructions in all):")
                for row in top(this[1], args.top):
                    print(f"  {row}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
