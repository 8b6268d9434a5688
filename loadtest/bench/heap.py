"""`python -m loadtest.bench.heap`: what a gateway's Python heap holds per open stream, and
which lines allocated it.

The burst benchmark measures RSS per open stream; this says where the Python part of it goes.
It starts the simulator (4 units of 2 nodes, 30 tokens a second apart: answers long enough to
stay open) and one gateway whose heap is traced (`loadtest.bench.heap_gateway`), snapshots the
heap once the gateway is idle and again once `--streams` streams are open (its in-flight gauge
says so), and prints the difference per open stream: the total, then the lines that hold the
most, by the line that allocated the memory (a C call counts as the line that made it).

    python -m loadtest.bench.heap --streams 1000
    python -m loadtest.bench.heap --streams 1000 --prompt-tokens 2000 --relay python

Memory outside Python's allocators (the event loop's own buffers, malloc's slack) is not
counted: RSS per stream is the burst benchmark's number, and it is the larger one.
"""

from __future__ import annotations

import argparse
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import time
import tracemalloc
import urllib.request
from pathlib import Path

from loadtest.bench.processes import MODEL, READY_TIMEOUT_S, child, gateway_toml, stop_child

TOP = 40
TOKENS = 30  # a second apart: each answer stays open 30 s
OPEN_TIMEOUT_S = 60.0  # for every stream to be open


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m loadtest.bench.heap", description=__doc__)
    p.add_argument("--streams", type=int, default=1000, help="open streams at the snapshot")
    p.add_argument("--prompt-tokens", type=int, help="prompt length (default: the shopping set)")
    p.add_argument("--relay", choices=("native", "python"), default="native")
    p.add_argument("--resume", choices=("on", "off"), default="on")
    p.add_argument("--top", type=int, default=TOP, help="lines to print")
    args = p.parse_args(argv)
    if args.streams < 1:
        p.error(f"--streams must be at least 1, not {args.streams}")
    return args


def _snapshot(pid: int, folder: Path, n: int) -> tracemalloc.Snapshot:
    """Ask the gateway (`pid`) for its snapshot number `n` and read it once written."""
    os.kill(pid, signal.SIGUSR1)
    path = folder / f"snapshot-{n}.pickle"
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not path.exists():
        if not Path(f"/proc/{pid}").exists() or time.monotonic() > deadline:
            raise SystemExit(f"the gateway wrote no heap snapshot {n}")
        time.sleep(0.2)
    with path.open("rb") as f:
        snapshot: tracemalloc.Snapshot = pickle.load(f)
    return snapshot


def _inflight(metrics_url: str) -> float:
    with urllib.request.urlopen(metrics_url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("unitgate_unit_inflight{")
    )


def _wait_open(metrics_url: str, streams: int, load: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + OPEN_TIMEOUT_S
    while (n := _inflight(metrics_url)) < streams:
        if load.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"{n:.0f} of {streams} streams open; the load generator stopped")
        time.sleep(0.5)


def _short(filename: str) -> str:
    """A file's path from its package: aiohttp/..., asyncio/..., gateway/..."""
    for root in ("site-packages/", "/lib/python3.", str(Path.cwd()) + "/"):
        if root in filename:
            tail = filename.split(root, 1)[1]
            return tail.split("/", 1)[1] if root.startswith("/lib/") else tail
    return filename


def _report(idle: tracemalloc.Snapshot, busy: tracemalloc.Snapshot, n: int, top: int) -> None:
    stats = busy.compare_to(idle, "lineno")
    total = sum(s.size_diff for s in stats)
    print(f"\n{total / n / 1024:.2f} KB of Python heap per open stream ({n} open)\n")
    print("| bytes per stream | objects per stream | allocated at |")
    print("|---:|---:|---|")
    for s in stats[:top]:
        frame = s.traceback[0]
        where = _short(frame.filename)
        print(f"| {s.size_diff / n:,.0f} | {s.count_diff / n:.2f} | {where}:{frame.lineno} |")


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    n = args.streams
    with tempfile.TemporaryDirectory(prefix="bench-heap-") as tmp_dir:
        tmp = Path(tmp_dir)
        sim_argv = ["loadtest.simunits", "--units", "4", "--followers", "1", "--ttft-ms", "50"]
        sim_argv += ["--itl-ms", "1000", "--tokens", str(TOKENS)]
        sim_argv += ["--ready-file", str(tmp / "sim.json")]
        with child(sim_argv, tmp / "sim.json", None, "simulator") as sim:
            config = tmp / "gw.toml"
            resume = args.resume == "on"
            toml = gateway_toml(sim["units"], cap=n, queue=n, resume=resume, relay=args.relay)
            config.write_text(toml)
            gw_argv = ["loadtest.bench.heap_gateway", str(tmp), "gateway", "--config", str(config)]
            gw_argv += ["--log-level", "warning", "--ready-file", str(tmp / "gw.json")]
            with child(gw_argv, tmp / "gw.json", None, "gateway", routes=True) as gw:
                idle = _snapshot(gw["pid"], tmp, 0)
                load_argv = ["loadtest", "--url", gw["public"], "--model", MODEL]
                load_argv += ["--concurrency", str(n), "--duration", str(TOKENS)]
                load_argv += ["--max-tokens", str(TOKENS), "--timeout", "120", "--no-progress"]
                load_argv += ["--out", str(tmp / "load")]
                if args.prompt_tokens is not None:
                    load_argv += ["--prompt-tokens", str(args.prompt_tokens)]
                load = subprocess.Popen(
                    [sys.executable, "-m", *load_argv], stdout=subprocess.DEVNULL
                )
                try:
                    _wait_open(gw["metrics"], n, load)
                    busy = _snapshot(gw["pid"], tmp, 1)
                finally:
                    stop_child(load)
    _report(idle, busy, n, args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
