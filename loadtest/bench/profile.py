"""`python -m loadtest.bench.profile`: where a gateway spends its CPU while relaying streams.

Starts the simulator and one gateway (pinned as the overhead benchmark pins them), runs the
overhead benchmark's closed loop at one point (ITL, concurrency), samples the gateway with
py-spy while it does (pausing it for each sample: without pausing, py-spy put much of the
Python code under the event loop's frame; a C call counts as the line that makes it), and
prints the functions that hold the most of its main thread's samples, by self time and by
total time (other threads' samples apart: py-spy counts an idle thread pool worker as
running). Run it for `--relay native` and `--relay python` to see the native relay's before
and after:

    python -m loadtest.bench.profile --relay python --itl 20 --concurrency 128
    python -m loadtest.bench.profile --relay native --itl 20 --concurrency 128

`--relay floor` profiles the overhead benchmark's floor relay (bytes verbatim) at the same
point, the yardstick beside the gateway, and `--relay nginx` or `--relay router` one of the
benchmark's peers, configured as it runs them (with `--perf` or `--syscalls`: py-spy sees only
Python); `--perf` samples with Linux perf instead of py-spy,
which sees C and kernel frames (the event loop, syscalls), and prints the relay's CPU per
request split by library (the Python interpreter, the kernel, the event loop, the native
relay...): each library's share of the samples times the CPU per request read from /proc.
Set beside the floor relay's, that split says where a relay's extra CPU goes: in the kernel
(syscalls, which the floor pays alike), in the interpreter (Python run per request or per
read), or in compiled code. `--syscalls` counts the system calls per request with strace
(which slows the relay, so reads coalesce more than they would). Each run prints the relay's
user and system CPU per request.

`--tokens N` sets the answers' length (64 by default): 16 tokens at 80 ms make streams as
long as 64 at 20 ms with a quarter of the reads, which tells what a relay spends per read
from what it spends per request and per second a stream is open.

`--idle S` profiles an idle gateway for S seconds instead (its background work: probes, the
loop-lag timer, the breakers). The collapsed stacks are written to `--out` for flame graphs.

`--gc` runs the point with no sampler (one would pause the gateway inside its collections)
and prints the garbage collector's collections and pause time per request, by generation,
from the gateway's `unitgate_gc_pause_seconds` before and after the measured loop.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from loadtest.bench.overhead import peers
from loadtest.bench.overhead.load import closed_loop
from loadtest.bench.overhead.params import TOKENS
from loadtest.bench.processes import (
    CLK_TCK,
    Pins,
    child,
    cpu_times,
    gateway_toml,
    pin_cpus,
    tree,
)
from loadtest.gen.client import open_session

TOP = 25
PEERS = ("nginx", "router")


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m loadtest.bench.profile", description=__doc__)
    p.add_argument(
        "--relay",
        choices=("native", "python", "floor", "nginx", "router"),
        default="native",
        help="the gateway's relay, the overhead benchmark's floor relay (bytes verbatim), or "
        "one of its peers (nginx, vllm-router)",
    )
    p.add_argument("--resume", choices=("on", "off"), default="on")
    p.add_argument("--itl", type=float, default=20.0, help="ms between tokens")
    p.add_argument(
        "--tokens",
        type=int,
        default=TOKENS,
        help="tokens per answer (fewer at a longer ITL: streams as long, fewer reads)",
    )
    p.add_argument("--concurrency", type=int, default=128)
    p.add_argument("--requests", type=int, default=1000)
    p.add_argument("--idle", type=float, default=0.0, help="profile an idle gateway instead")
    p.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    p.add_argument(
        "--perf",
        action="store_true",
        help="sample with Linux perf instead (C and kernel frames: the event loop, syscalls, GC)",
    )
    p.add_argument(
        "--syscalls",
        action="store_true",
        help="count system calls with strace instead (per request, warm-up included)",
    )
    p.add_argument(
        "--gc",
        action="store_true",
        help="no sampler: the garbage collector's collections and pauses per request, read from"
        " the gateway's /metrics (unitgate_gc_pause_seconds) before and after the loop",
    )
    p.add_argument("--out", type=Path, default=Path("bench-out"))
    args = p.parse_args(argv)
    if args.gc and (args.perf or args.syscalls or args.idle or args.relay not in PYTHON_RELAYS):
        p.error("--gc reads a gateway under load: --relay native or python, no other sampler")
    if args.relay in PEERS and not (args.perf or args.syscalls):
        p.error(f"--relay {args.relay} is not Python: sample it with --perf or --syscalls")
    if args.tokens < 1:
        p.error(f"--tokens must be at least 1, not {args.tokens}")
    return args


PYTHON_RELAYS = ("native", "python")  # the gateway's own: what has a /metrics

# A line of `perf report --sort dso --stdio`: "    45.14%  libpython3.11.so.1.0".
_DSO_LINE = re.compile(r"^\s*([0-9.]+)%\s+(\S.*?)\s*$")


def _pyspy() -> str:
    found = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(found).exists():
        raise SystemExit("py-spy is not installed (pip install py-spy)")
    return found


async def _load(relay: dict[str, Any], args: argparse.Namespace) -> tuple[float, float, str]:
    """Seconds the measured loop took, and the relay's CPU us per request over it (a number,
    and a line saying it with the throughput and TTFT)."""
    url, pid = relay["public"], int(relay["pid"])
    conc, n, tokens = args.concurrency, args.requests, args.tokens
    spread = tokens * args.itl / 1e3
    async with open_session(conc) as session:
        await closed_loop(session, (url,), 2 * conc, conc, spread, tokens)  # warm-up
        pauses = await gc_pauses(session, relay["metrics"]) if args.gc else {}
        t0, before = time.perf_counter(), cpu_times(pid)
        loop = await closed_loop(session, (url,), n, conc, spread, tokens)
        after = cpu_times(pid)
        if args.gc:
            _report_gc(pauses, await gc_pauses(session, relay["metrics"]), n)
        failed = sum(1 for r in loop.records if not r.ok)
        if failed:
            raise SystemExit(f"{failed} requests failed: the profile is not valid")
        user, system = ((b - a) * 1e6 / CLK_TCK / n for a, b in zip(before, after, strict=True))
        took = time.perf_counter() - t0
        ttft = sorted(r.ttft for r in loop.records if r.ttft is not None)
        p50, p99 = (ttft[min(len(ttft) - 1, int(q * len(ttft)))] * 1e3 for q in (0.5, 0.99))
        said = f"user {user:,.0f} us + system {system:,.0f} us per request, {n / took:.0f} req/s"
        return took, user + system, f"{said}, TTFT p50 {p50:.1f} ms, p99 {p99:.1f} ms"


async def gc_pauses(session: aiohttp.ClientSession, metrics: str) -> dict[str, tuple[float, float]]:
    """The gateway's garbage collections so far: (count, seconds paused) by generation."""
    async with session.get(metrics + "/metrics") as r:
        return gc_totals(await r.text())


def gc_totals(text: str) -> dict[str, tuple[float, float]]:
    """`unitgate_gc_pause_seconds`' count and sum by generation, from a /metrics text."""
    counts: dict[str, float] = {}
    sums: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name != "unitgate_gc_pause_seconds":
            continue
        for sample in family.samples:
            generation = sample.labels.get("generation", "")
            if sample.name.endswith("_count"):
                counts[generation] = sample.value
            elif sample.name.endswith("_sum"):
                sums[generation] = sample.value
    return {g: (counts[g], sums.get(g, 0.0)) for g in sorted(counts)}


def _report_gc(
    before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]], n: int
) -> None:
    if not after:
        raise SystemExit("the gateway exports no unitgate_gc_pause_seconds: too old for --gc")
    total = 0.0
    print(f"garbage collection over {n} requests (the gateway's /metrics):")
    for generation, (count, paused) in after.items():
        count0, paused0 = before.get(generation, (0.0, 0.0))
        runs, took = count - count0, paused - paused0
        total += took
        each = f", {took / runs * 1e3:.2f} ms each" if runs else ""
        print(f"  generation {generation}: {runs:.0f} collections, {took * 1e3:.1f} ms{each}")
    print(f"  {total * 1e6 / n:.1f} us of pause per request")


@contextlib.contextmanager
def _relay(
    relay: str, resume: bool, tmp: Path, sim: dict[str, Any], cpu: int | None
) -> Iterator[dict[str, Any]]:
    """The measured process, running over the simulated units: its URL (`public`) and the
    pid that relays (`pid`: nginx's worker, not its master)."""
    units = sim["units"]
    if relay in PEERS:
        leaders = tuple(u["leader"] for u in units)
        if relay == "nginx":
            with peers.nginx(tmp, leaders, cpu) as (url, master):
                yield {"public": url, "pid": tree(master)[1]}  # its one worker process
        else:
            with peers.vllm_router(leaders, cpu) as (url, pid):
                yield {"public": url, "pid": pid}
        return
    # The floor relay reads the units from a gateway's config.
    toml = gateway_toml(units, resume=resume, relay="native" if relay == "floor" else relay)
    (tmp / "gw.toml").write_text(toml)
    argv = ["--config", str(tmp / "gw.toml"), "--ready-file", str(tmp / "gw.json")]
    if relay == "floor":
        argv = ["loadtest.bench.overhead.floor_relay", *argv]
    else:
        argv = ["gateway", "gateway", *argv, "--log-level", "warning"]
    with child(argv, tmp / "gw.json", cpu, relay, relay != "floor") as info:
        yield info


def _sampler_argv(perf: bool, rate: int, pid: int, out: Path, syscalls: bool = False) -> list[str]:
    if syscalls:
        return ["strace", "-c", "-f", "-p", str(pid), "-o", str(out)]
    if perf:
        return ["perf", "record", "-F", str(rate), "-g", "-p", str(pid), "-o", str(out)]
    argv = [_pyspy(), "record", "--format", "raw", "--rate", str(rate)]
    return [*argv, "--pid", str(pid), "-o", str(out)]


# A sample of a thread other than the main one starts in threading's bootstrap.
THREAD_ROOT = "Thread._bootstrap ("


class Tally:
    """Samples, and their counts by innermost frame (self) and by every frame (total)."""

    def __init__(self) -> None:
        self.samples = 0
        self.own: collections.Counter[str] = collections.Counter()
        self.total: collections.Counter[str] = collections.Counter()

    def add(self, frames: list[str], n: int) -> None:
        self.samples += n
        self.own[frames[-1]] += n
        for frame in set(frames):
            self.total[frame] += n


def tally(lines: list[str]) -> tuple[Tally, Tally]:
    """py-spy's collapsed stacks ("frame;frame;... count") as (the main thread's, the other
    threads'). py-spy counts a thread pool's worker waiting
    on its queue as running, so the other threads' samples (often all idle waits) are kept
    apart: the main thread, which runs the event loop, is what the shares are of."""
    main, others = Tally(), Tally()
    for line in lines:
        trace, _, count = line.rpartition(" ")
        frames = trace.split(";")
        side = others if frames[0].startswith(THREAD_ROOT) else main
        side.add(frames, int(count))
    return main, others


def _report(stacks: Path, label: str) -> None:
    main, others = tally(stacks.read_text().splitlines())
    print(f"\n{label}: {main.samples} samples of the main thread")
    for title, table in (("self", main.own), ("total", main.total)):
        print(f"\n  top {TOP} by {title} time (% of the main thread's samples)")
        for frame, n in table.most_common(TOP):
            print(f"  {100 * n / max(main.samples, 1):6.2f}%  {frame[:150]}")
    if others.samples:
        print(f"\n  other threads: {others.samples} samples (py-spy counts idle waits), by self")
        for frame, n in others.own.most_common(5):
            print(f"  {n:7d}  {frame[:150]}")


def library_shares(report: str) -> list[tuple[str, float]]:
    """`perf report --sort dso --stdio` as (library, % of samples), in the report's order
    (largest first); a kernel's symbol table is named "kernel"."""
    shares = []
    for line in report.splitlines():
        match = _DSO_LINE.match(line)
        if match is not None:
            name = match.group(2)
            shares.append(("kernel" if name == "[kernel.kallsyms]" else name, float(match[1])))
    return shares


def _libraries(data: Path, label: str, cpu_us: float) -> None:
    """The relay's CPU per request by library: perf's shares of the samples (the warm-up's
    included) times the CPU per request /proc gave for the measured loop."""
    argv = ["perf", "report", "-i", str(data), "--no-children", "--sort", "dso", "--stdio"]
    report = subprocess.run([*argv, "-g", "none"], capture_output=True, text=True, check=False)
    shares = library_shares(report.stdout)
    if not shares:
        print(f"perf report gave no samples: {report.stderr.strip()[:300]}", file=sys.stderr)
        return
    if cpu_us > 0:
        print(f"\n{label}: CPU per request by library (perf's share x /proc's CPU per request)")
    else:  # idle: no requests to share it among
        print(f"\n{label}: CPU by library (% of perf's samples)")
    for name, share in shares[:TOP]:
        if share >= 0.5:
            us = f"{share * cpu_us / 100:7.0f} us  " if cpu_us > 0 else ""
            print(f"  {share:6.2f}%  {us}{name[:80]}")


def _syscalls(table: Path, label: str, requests: int) -> None:
    """strace -c's table, as calls per request (the warm-up's requests counted in)."""
    print(f"\n{label}: system calls per request ({requests} requests, warm-up included)")
    for line in table.read_text().splitlines():
        cols = line.split()
        if len(cols) >= 5 and cols[3].isdigit():
            print(f"  {int(cols[3]) / requests:7.2f}  {cols[-1]}")


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    pins: Pins | None = pin_cpus()
    if pins is not None:
        os.sched_setaffinity(0, {pins.load})
    args.out.mkdir(parents=True, exist_ok=True)
    tag = f"{args.relay}-resume-{args.resume}-itl{args.itl:g}-c{args.concurrency}"
    if args.tokens != TOKENS:
        tag += f"-tokens{args.tokens}"
    if args.idle:
        tag = f"{args.relay}-idle"
    stacks = args.out / f"profile-{tag}.txt"
    with tempfile.TemporaryDirectory(prefix="unitgate-profile-") as tmp_name:
        tmp = Path(tmp_name)
        sim_argv = ["loadtest.simunits", "--units", "2", "--followers", "0", "--ttft-ms", "0"]
        sim_argv += ["--itl-ms", f"{args.itl:g}", "--tokens", str(args.tokens)]
        sim_argv += ["--ready-file", str(tmp / "sim.json")]
        with child(sim_argv, tmp / "sim.json", None, "simulator") as sim:
            relay_cpu = None if pins is None else pins.relay
            with _relay(args.relay, args.resume == "on", tmp, sim, relay_cpu) as gw:
                if args.perf:
                    stacks = stacks.with_suffix(".perf.data")
                if args.syscalls:
                    stacks = stacks.with_suffix(".strace.txt")
                if args.gc:  # no sampler: it would pause the process inside the collections
                    took, _, cpu = asyncio.run(_load(gw, args))
                    print(f"{tag}: {cpu} (from /proc, no sampler)")
                    return 0
                spy = subprocess.Popen(
                    _sampler_argv(args.perf, args.rate, int(gw["pid"]), stacks, args.syscalls)
                )
                try:
                    time.sleep(1.0)  # py-spy attached
                    if args.idle:
                        time.sleep(args.idle)
                        took, cpu_us = args.idle, 0.0
                    else:
                        took, cpu_us, cpu = asyncio.run(_load(gw, args))
                        print(f"{tag}: {cpu} (from /proc, sampler attached)")
                finally:
                    spy.send_signal(2)  # SIGINT: py-spy writes what it has
                    spy.wait(30)
    if not stacks.exists():
        print(f"py-spy wrote no profile (exit {spy.returncode})", file=sys.stderr)
        return 1
    if args.syscalls:
        _syscalls(stacks, tag, args.requests + 2 * args.concurrency)
        return 0
    if args.perf:
        print(f"{tag}: {took:.1f} s; perf samples in {stacks} (perf report -i {stacks})")
        _libraries(stacks, tag, cpu_us)
        return 0
    print(f"{tag}: {took:.1f} s; collapsed stacks in {stacks}")
    _report(stacks, tag)
    return 0


if __name__ == "__main__":
    sys.exit(main())
