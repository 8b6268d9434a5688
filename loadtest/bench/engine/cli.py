"""The command line and the top level: each measurement's processes in turn, then the report."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import loadtest.bench.engine
from gateway.base.ports import free_port
from loadtest.bench.engine import analyze
from loadtest.bench.engine.report import render
from loadtest.bench.engine.run import loadavg, machine, read, run_group, worker


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m loadtest.bench.engine",
        description=loadtest.bench.engine.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", type=Path, required=True, help="directory for engine.json + logs")
    p.add_argument("--quick", action="store_true", help="fewer iterations and rounds")
    p.add_argument("--iters", type=int, default=None, help="broadcast iterations (2000/300)")
    p.add_argument("--rounds", type=int, default=None, help="generate rounds (10/3)")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument(
        "--model",
        default="tiny",
        choices=("tiny", "smollm2"),
        help="the seeded tiny model, or the real SmolLM2 (a step is ~100x longer: use --quick"
        " and a small --max-tokens)",
    )
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


def _tp2_engine(out: Path, logs: Path, extra: list[str], model: str) -> tuple[Any, Any]:
    """The instrumented leader and the real follower loop; (leader result, follower result)."""
    master = f"127.0.0.1:{free_port()}"
    files = [out / f"engine-tp2-rank{r}.json" for r in (0, 1)]
    common = ["--master", master, "--threads", "1", "--world-size", "2"]
    leader = worker("engine", files[0], *common, *extra)
    follower = worker("follower", files[1], *common, "--rank", "1", "--model", model)
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
    settings["model"] = args.model
    res: dict[str, Any] = {"machine": machine(), "settings": settings}
    gen = ["--rounds", str(rounds), "--max-tokens", str(args.max_tokens), "--model", args.model]
    t0 = time.monotonic()

    b0, b1 = _pair("bcast", "bcast", raw, logs, ["--iters", str(iters)])
    res["broadcast"] = analyze.broadcast(b0["data"], b1["data"])
    f0, _ = _pair("forward-tp2", "forward", raw, logs, gen)
    fwd = {"tp2_t1": analyze.forward(f0["data"])}
    l0, l1 = _pair("bare-tp2", "bare", raw, logs, gen)
    res["bare_loop"] = analyze.broadcast(l0["data"], l1["data"])
    lead, follow = _tp2_engine(raw, logs, gen, args.model)
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
