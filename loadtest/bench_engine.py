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

2. Per-step runtime overhead at TP=2, from stamps paired within each step. The leader is an
   instrumented LeaderEngine subclass (step start/end, forward start/end, send() start/end);
   the follower is the real follower loop (`engine.runtime.follower.run_follower`) on a model
   whose forwards are stamped, with receive() stamped too. The leader's i-th forward and the
   follower's i-th forward are the same step. The model runs from the moment both ranks are
   inside forward (the later start; whoever is first waits at the first all-reduce) to the
   leader's forward end; the rest of the step is the runtime's: schedule, the step message
   on the wire, the follower decoding it, sampling, the scheduler update and the token
   events. Only steps that decode the full batch (1 or 8 single-token entries) count. The
   p50 of that per-step runtime is compared with the one-way broadcast p50 of (1).
   Why paired: the model time at TP=2 moves by 1-2 ms between runs (Gloo all-reduce tails on
   loopback), so "step p50 minus a separately measured forward p50" could not resolve a few
   hundred microseconds (it read 0.6x and 2.6x on two runs of the same code). Also shown: the
   lockstep forward alone (both ranks, no runtime) beside the model time inside the step, and
   the runtime per step at TP=1, where there is no follower and step minus forward is exact.

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

from loadtest.bench.processes import free_port
from loadtest.benchengine import analyze
from loadtest.benchengine.report import render
from loadtest.benchengine.run import loadavg, machine, read, run_group, worker


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


def _tp2_engine(out: Path, logs: Path, extra: list[str]) -> tuple[Any, Any]:
    """The instrumented leader and the real follower loop; (leader result, follower result)."""
    master = f"127.0.0.1:{free_port()}"
    files = [out / f"engine-tp2-rank{r}.json" for r in (0, 1)]
    common = ["--master", master, "--threads", "1", "--world-size", "2"]
    leader = worker("engine", files[0], *common, *extra)
    follower = worker("follower", files[1], *common, "--rank", "1")
    run_group("engine-tp2", [leader, follower], logs)
    return read(files[0]), read(files[1])


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
    l0, l1 = _pair("bare-tp2", "bare", raw, logs, gen)
    res["bare_loop"] = analyze.broadcast(l0["data"], l1["data"])
    lead, follow = _tp2_engine(raw, logs, gen)
    engines = {"tp2_t1": lead}
    calls = follow["data"]["calls"]
    res["runtime"] = analyze.runtime(lead["data"], calls, res["broadcast"], res["bare_loop"])
    for threads in (1, 2):
        key, t = f"tp1_t{threads}", ["--world-size", "1", "--threads", str(threads)]
        e_file = raw / f"engine-{key}.json"
        run_group(f"engine-{key}", [worker("engine", e_file, *t, *gen)], logs)
        engines[key] = read(e_file)

    res["configs"] = {
        "tp2_t1": "TP=2, 1 thread/rank",
        "tp1_t1": "TP=1, 1 thread",
        "tp1_t2": "TP=1, 2 threads",
    }
    res["torch_threads"] = {k: e["torch_threads"] for k, e in engines.items()}
    res["forward_us"] = fwd
    res["engine"] = {k: analyze.engine(e["data"]) for k, e in engines.items()}
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
