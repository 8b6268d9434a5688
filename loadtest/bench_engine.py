"""`python -m loadtest.bench_engine --out DIR [--quick]`: the builtin engine's step costs.

Three measurements, side by side in one run, each in fresh processes (loadtest.benchengine.
worker) so every rank owns its torch thread count and its Gloo world on a free 127.0.0.1 port:

1. Broadcast latency of the step message alone. Two ranks; per iteration the leader calls
   `engine.runtime.messages.send` on exactly the message `LeaderEngine._step` sends for a
   decode step of 1 or 8 sequences, the follower calls `receive` (what `run_follower` calls)
   and, once it has the decoded message, acks with a 1-value broadcast from rank 1. Leader and
   follower stamp CLOCK_MONOTONIC (shared by all processes on Linux), so "one-way" is the true
   time from the leader entering send() to the follower holding the decoded message, with no
   queueing (one message in flight). Also shown: how long send() blocks the leader, and the
   round trip. The one-way p50 is the "raw broadcast latency" the aim is measured against.

2. Per-step runtime overhead at TP=2. The step: an instrumented LeaderEngine subclass times
   its `_step` (schedule, broadcast, forward, sampling, scheduler update, token events) while
   the real follower (`python -m engine.runtime.node --role follower`) mirrors it; only steps
   that decode the full batch (1 or 8 single-token entries) count. The forward alone: both
   ranks run the same model forward on the same decode batches at the same positions in
   lockstep (the all-reduces keep them together), with no messaging, scheduling or sampling.
   overhead = step p50 - forward p50. Why not the forward timed inside the step: the
   follower starts its forward only after the message arrives, so the leader's in-step
   forward absorbs that wait at its first all-reduce; splitting the step there would hide the
   messaging cost. It is printed as "fwd-in-step" for reference. The cadence (start-to-start
   period of consecutive decode steps) also counts the loop's inbox handling and the GIL
   shared with the asyncio consumer; its overhead and ratio are printed too.

3. Decode throughput through `LeaderEngine.generate` (no HTTP), 1 and 8 concurrent requests,
   greedy, ignore_eos, a fixed 16-token prompt: decode tok/s = tokens after each request's
   first / (last token - first token of any request); e2e tok/s = all tokens / (last token -
   submit). At TP=1 (leader only) with 1 and 2 torch threads, and at TP=2 (leader + follower
   subprocess). Each round runs the batch to completion; one warm-up round is discarded.

Threads: every TP=2 rank runs torch.set_num_threads(1) (2 cores, 2 ranks: more would
oversubscribe); TP=1 is measured with 1 and 2. Nothing is pinned. The machine's load average
is recorded at start and end: other work on the 2 cores inflates everything.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from loadtest.benchengine import analyze
from loadtest.benchengine.report import render
from loadtest.benchengine.run import free_port, loadavg, machine, read, run_group, worker


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m loadtest.bench_engine", description=__doc__)
    p.add_argument("--out", type=Path, required=True, help="directory for engine.json + logs")
    p.add_argument("--quick", action="store_true", help="fewer iterations and rounds")
    p.add_argument("--iters", type=int, default=None, help="broadcast iterations (2000/300)")
    p.add_argument("--rounds", type=int, default=None, help="generate rounds (10/3)")
    p.add_argument("--max-tokens", type=int, default=64)
    return p


def _pair(name: str, job: str, out: Path, logs: Path, extra: list[str]) -> tuple[Any, Any]:
    master = f"127.0.0.1:{free_port()}"
    files = [out / f"{name}-rank{r}.json" for r in (0, 1)]
    argvs = [
        worker(job, files[r], "--rank", str(r), "--master", master, "--threads", "1", *extra)
        for r in (0, 1)
    ]
    run_group(name, argvs, logs)
    return read(files[0]), read(files[1])


def _tp2_engine(out: Path, logs: Path, extra: list[str]) -> dict[str, Any]:
    master = f"127.0.0.1:{free_port()}"
    result = out / "engine-tp2-rank0.json"
    follower = ["engine.runtime.node", "--role", "follower", "--rank", "1", "--world-size"]
    follower += ["2", "--master", master, "--threads", "1", "--collective-timeout", "60"]
    follower += ["--unit", "bench", "--num-slots", "8", "--seed", "0"]
    leader = worker("engine", result, "--master", master, "--threads", "1", *extra)
    run_group("engine-tp2", [leader, follower], logs)
    return read(result)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    out: Path = args.out
    raw, logs = out / "raw", out / "logs"
    raw.mkdir(parents=True, exist_ok=True)
    logs.mkdir(parents=True, exist_ok=True)
    iters = args.iters or (300 if args.quick else 2000)
    rounds = args.rounds or (3 if args.quick else 10)
    settings = {"iters": iters, "warmup_iters": 50, "rounds": rounds}
    settings |= {"max_tokens": args.max_tokens, "batches": [1, 8], "prompt_tokens": 16}
    res: dict[str, Any] = {"machine": machine(), "settings": settings}
    gen = ["--rounds", str(rounds), "--max-tokens", str(args.max_tokens)]
    t0 = time.monotonic()

    b0, b1 = _pair("bcast", "bcast", raw, logs, ["--iters", str(iters)])
    res["broadcast"] = analyze.broadcast(b0["data"], b1["data"])
    f0, _ = _pair("forward-tp2", "forward", raw, logs, gen)
    fwd = {"tp2_t1": analyze.forward(f0["data"])}
    engines = {"tp2_t1": _tp2_engine(raw, logs, ["--world-size", "2", *gen])}
    for threads in (1, 2):
        key, t = f"tp1_t{threads}", ["--world-size", "1", "--threads", str(threads)]
        f_file, e_file = raw / f"forward-{key}.json", raw / f"engine-{key}.json"
        run_group(f"forward-{key}", [worker("forward", f_file, *t, *gen)], logs)
        run_group(f"engine-{key}", [worker("engine", e_file, *t, *gen)], logs)
        fwd[key] = analyze.forward(read(f_file)["data"])
        engines[key] = read(e_file)

    res["configs"] = {
        "tp2_t1": "TP=2, 1 thread/rank",
        "tp1_t1": "TP=1, 1 thread",
        "tp1_t2": "TP=1, 2 threads",
    }
    res["torch_threads"] = {k: e["torch_threads"] for k, e in engines.items()}
    res["forward_us"] = fwd
    res["engine"] = {k: analyze.engine(e["data"]) for k, e in engines.items()}
    bcast = res["broadcast"]
    res["overhead"] = {
        k: analyze.overhead(res["engine"][k], fwd[k], bcast if k.startswith("tp2") else None)
        for k in engines
    }
    outputs = {json.dumps(t) for e in res["engine"].values() for b in e for t in e[b]["tokens"]}
    res["outputs_identical"] = len(outputs) == 1
    res["machine"]["loadavg_end"] = loadavg()
    res["elapsed_s"] = round(time.monotonic() - t0, 1)
    return res


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    res = measure(args)
    (args.out / "engine.json").write_text(json.dumps(res, indent=2))
    print(render(res))
    print(f"\nraw timings: {args.out / 'raw'}; summary: {args.out / 'engine.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
