"""Tensor against pipeline parallelism across nodes, side by side in one run: SmolLM2 (the
packaged GGUF, the file's blocks) as a 1-node unit, a 2-node TP unit and a 2-node `pp = 2`
unit (with `--four`: PP 4 and tp 2 x pp 2 on 4 nodes, beside TP 3: SmolLM2's 3 KV heads
cannot be split over 4 ranks, so TP 3 is the widest TP unit it has).

    python -m loadtest.bench.pipeline [--four] [--rounds 3] [--quiet-wait 120]

Every node is a real process with one torch thread (`unitgate node`'s flags), joined in a
real Gloo group on loopback; the leader runs in a job process of its own and drives its
engine directly (no HTTP), so the figures are the engine's. Per unit: decode tokens/s of one
stream and of 8 streams at once (greedy, EOS ignored, counted from the moment every stream
has its first token, so the prefill is excluded), each the best of `--rounds`, and the
ratio to the 1-node unit measured in the same run.

The rounds go through the units in turn (1 node, TP 2, PP 2, 1 node, ...), so a burst of
other work on the machine does not land on one unit only; and before each unit starts, the
bench waits (up to `--quiet-wait` seconds) for a second in which the machine is at least 90%
idle. A 2-node unit needs both cores where a 1-node unit needs one, so it loses twice as
much to anything else running; the idle share each measurement started at is printed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gateway.base.ports import free_port
from loadtest.bench.processes import stop_child

ROOT = Path(__file__).resolve().parents[2]
QUESTION = [{"role": "user", "content": "I need running shoes for flat feet. What to look for?"}]
BATCHES = {1: 64, 8: 32}  # streams -> tokens each
MARK = "unitgate-bench-result "
SHAPES = {"1 node": (1, 1), "tp 2": (2, 1), "pp 2": (2, 2)}
FOUR = {"tp 3": (3, 1), "pp 4": (4, 4), "tp 2 x pp 2": (4, 2)}
FLAGS = ("--model", "smollm2", "--weight-dtype", "gguf", "--max-seq-len", "256")
NODE = ("--threads", "1", "--num-slots", "8", "--collective-timeout", "30", *FLAGS)


def node_argv(rank: int, world: int, pp: int, master: str) -> list[str]:
    role = "leader" if rank == 0 else "follower"
    return [
        *("--role", role, "--rank", str(rank), "--world-size", str(world), "--pp", str(pp)),
        *("--master", master, "--unit", "bench", *NODE),
    ]


async def decode_rate(engine: Any, streams: int, tokens: int) -> float:
    """Tokens/s of `streams` greedy streams once all have their first token."""
    from engine.api import GenerationRequest
    from engine.scheduler import SamplingParams

    prompt = tuple(engine.tokenizer.apply_chat_template(QUESTION))
    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    firsts: list[float] = []
    lasts: list[float] = []

    async def one(i: int) -> int:
        count = 0
        request = GenerationRequest(f"r{i}-{time.monotonic_ns()}", prompt, params)
        async for event in engine.generate(request):
            if event.token_id is not None:
                count += 1
                if count == 1:
                    firsts.append(time.monotonic())
                lasts.append(time.monotonic())
        return count

    await asyncio.gather(*(one(i) for i in range(streams)))
    start = max(firsts)
    after = sum(1 for t in lasts if t > start)
    return after / (max(lasts) - start)


def leader_job(argv: list[str], rounds: int) -> int:
    """Run in the leader's process: start the engine, measure, print one result line."""
    from engine.backends.builtin.node import start_leader
    from engine.flags import parse

    engine = start_leader(parse(argv))
    try:
        result = {
            str(streams): max(
                asyncio.run(decode_rate(engine, streams, tokens)) for _ in range(rounds)
            )
            for streams, tokens in BATCHES.items()
        }
    finally:
        engine.shutdown(timeout=10.0)
    print(MARK + json.dumps(result), flush=True)
    return 0


def run_unit(world: int, pp: int, rounds: int, logs: Path) -> dict[str, float]:
    master = f"127.0.0.1:{free_port()}"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for rank in range(1, world):
            log = (logs / f"w{world}-pp{pp}-rank{rank}.log").open("wb")
            bare = [sys.executable, "-m", "engine.backends.builtin.bare"]
            procs.append(
                subprocess.Popen(
                    [*bare, *node_argv(rank, world, pp, master)],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                )
            )
        job = [sys.executable, "-m", "loadtest.bench.pipeline", "--job", "--rounds", str(rounds)]
        out = subprocess.run(
            [*job, "--", *node_argv(0, world, pp, master)],
            capture_output=True,
            env=env,
            timeout=600,
            check=False,
        )
        (logs / f"w{world}-pp{pp}-rank0.log").write_bytes(out.stdout + out.stderr)
        lines = [x for x in out.stdout.decode().splitlines() if x.startswith(MARK)]
        if out.returncode or not lines:
            raise RuntimeError(f"world {world} pp {pp}: leader exited {out.returncode}; {logs}")
        result: dict[str, float] = json.loads(lines[-1][len(MARK) :])
        return result
    finally:
        for proc in procs:
            stop_child(proc)


def idle_share(seconds: float = 1.0) -> float:
    """The share of the machine's CPU time that was idle over the next `seconds`."""

    def read() -> list[int]:
        with open("/proc/stat") as f:
            return [int(v) for v in f.readline().split()[1:9]]

    before = read()
    time.sleep(seconds)
    delta = [b - a for a, b in zip(before, read(), strict=True)]
    return (delta[3] + delta[4]) / max(1, sum(delta))


def wait_quiet(limit_s: float, want: float = 0.9) -> float:
    """Wait up to `limit_s` for a second at least `want` idle; the last idle share seen."""
    deadline = time.monotonic() + limit_s
    while (idle := idle_share()) < want and time.monotonic() < deadline:
        pass
    return idle


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.bench.pipeline", description=__doc__)
    p.add_argument("--four", action="store_true", help="also TP 3, PP 4 and tp 2 x pp 2")
    p.add_argument("--rounds", type=int, default=3, help="best of this many (3)")
    p.add_argument("--quiet-wait", type=float, default=120.0, help="seconds, per unit (120)")
    p.add_argument("--job", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--logs", type=Path, default=Path("/tmp/unitgate-bench-pipeline"))
    p.add_argument("node", nargs="*", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.job:
        return leader_job(args.node, 1)
    args.logs.mkdir(parents=True, exist_ok=True)
    shapes = {**SHAPES, **(FOUR if args.four else {})}
    best: dict[str, dict[str, float]] = {}
    idle: dict[str, list[float]] = {name: [] for name in shapes}
    for _ in range(args.rounds):
        for name, (world, pp) in shapes.items():
            idle[name].append(wait_quiet(args.quiet_wait))
            r = run_unit(world, pp, 1, args.logs)
            kept = best.setdefault(name, r)
            best[name] = {k: max(v, kept[k]) for k, v in r.items()}
    print(f"SmolLM2 gguf, 1 thread per node, {os.cpu_count()} cores; decode tokens/s,")
    print(f"best of {args.rounds} rounds; ratios to the 1-node unit of this run")
    base = best[next(iter(shapes))]
    for name, r in best.items():
        seen = ", ".join(f"{share:.0%}" for share in idle[name])
        print(
            f"  {name:<12} 1 stream {r['1']:6.1f} ({r['1'] / base['1']:.2f}x)"
            f"   8 streams {r['8']:6.1f} ({r['8'] / base['8']:.2f}x)   idle at start {seen}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
