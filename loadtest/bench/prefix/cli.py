"""Flags and the top level: the model folder, the servers and routes, every pressure's modes in
turn, the report."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import loadtest.bench.prefix
from gateway.kvevents.prompts import PromptTokens
from loadtest.bench.machine import machine_facts
from loadtest.bench.prefix import report, scrape, summary
from loadtest.bench.prefix.fleet import Fleet, fleet, version
from loadtest.bench.prefix.pressure import BLOCK_SIZE, NULL_BLOCKS, Kv
from loadtest.bench.prefix.routes import ALL_MODES, MODES, routes
from loadtest.bench.prefix.run import Settings, measure, plan
from loadtest.bench.stock_vllm import export_smollm2

ROOT = Path(__file__).resolve().parents[3]


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m loadtest.bench.prefix",
        description=loadtest.bench.prefix.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", type=Path, default=Path("bench-out"), help="DIR/prefix.{json,md}")
    p.add_argument("--servers", type=int, default=2)
    p.add_argument("--kv-mib", type=int, default=360, help="each server's KV cache")
    p.add_argument(
        "--pressures", type=float, nargs="+", default=[0.35, 0.75],
        help="working sets, as shares of the fleet's KV blocks",
    )  # fmt: skip
    p.add_argument("--prefix-words", type=int, default=960, help="a group's system prompt")
    p.add_argument("--rounds", type=int, default=24, help="requests per group")
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=6, help="output tokens per request")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--modes", nargs="+", choices=ALL_MODES, default=list(MODES))
    p.add_argument("--model", type=Path, help="an exported SmolLM2 folder (default: exported)")
    default_python = ROOT / ".venv-vllm" / "bin" / "python"
    p.add_argument(
        "--vllm-python", default=str(default_python) if default_python.exists() else sys.executable,
        help="the Python whose vLLM serves (default: .venv-vllm's)",
    )  # fmt: skip
    p.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    args = p.parse_args(argv)
    args.vllm_python = _python(args.vllm_python)
    if args.quick:  # half the cache, half the prefix: the same pressures, fewer tokens
        args.kv_mib, args.prefix_words, args.rounds = 180, 480, 3
    if min(args.servers, args.kv_mib, args.rounds, args.concurrency, args.max_tokens) < 1:
        p.error("--servers, --kv-mib, --rounds, --concurrency and --max-tokens must be >= 1")
    return args


def _python(given: str) -> str:
    """An absolute path (the servers run in a temporary folder), its symlinks kept: a venv's
    python is a link to the interpreter, and only the link's path finds the venv."""
    if os.sep in given:
        return os.path.abspath(given)
    return shutil.which(given) or given


def _model(given: Path | None, out: Path) -> Path:
    """The given folder, else OUT/smollm2-hf, exported from the packaged GGUF when missing."""
    if given is not None:
        return given.resolve()
    folder = out / "smollm2-hf"
    if not (folder / "config.json").exists():
        export_smollm2(folder)
    return folder


def _reported(f: Fleet, computed: int) -> tuple[int, int]:
    """(blocks, block size) the servers report (vllm:cache_config_info), which must agree;
    the computed count and the CPU build's block size where a server does not say."""
    infos = {url: scrape.cache_info(text) for url, text in f.metrics().items()}
    sizes = set()
    for info in infos.values():
        blocks, size = info.get("num_gpu_blocks", ""), info.get("block_size", "")
        if not (blocks.isdigit() and size.isdigit()):
            print(f"note: a server does not report its blocks; {computed} computed are used")
            return computed, BLOCK_SIZE
        sizes.add((int(blocks), int(size)))
    if len(sizes) != 1:
        raise RuntimeError(f"the servers' caches differ: {infos}")
    return sizes.pop()


def _bench(args: argparse.Namespace, model: Path, kv: Kv, tmp: Path) -> dict[str, Any]:
    settings = Settings(
        args.prefix_words, args.rounds, args.concurrency, args.max_tokens, args.seed
    )
    tokens = PromptTokens(model)
    results, plans = [], []
    with fleet(tmp, model, args.servers, kv.bytes, args.vllm_python) as f:
        blocks, block_size = _reported(f, kv.blocks)
        print(f"each server reports {blocks} blocks of {block_size} tokens", flush=True)
        f.warm()
        with routes(tmp, f.servers, args.modes, model) as ways:
            for target in args.pressures:
                planned = plan(
                    target, settings, tokens, blocks - NULL_BLOCKS, len(f.servers), block_size
                )
                plans.append(planned)
                print(f"\n{planned.pressure.describe()}; {len(planned.prompt_tokens)} requests,"
                      f" hit ceiling {planned.ceiling:.0%}", flush=True)  # fmt: skip
                for mode in args.modes:
                    result = measure(planned, mode, ways, f, settings)
                    results.append(result)
                    _progress(report.row(result))
        found = {"reported_blocks": blocks, "block_size": block_size, "vllm": version(f.urls[0])}
    return found | {"results": results, "plans": plans}


def _progress(r: dict[str, Any]) -> None:
    print(
        f"  {r['mode']:>12}: {r['requests']} requests in {r['wall_s']:.0f} s, TTFT p50"
        f" {r['ttft_p50_s']:.2f} s p90 {r['ttft_p90_s']:.2f} s, hit rate {r['hit_rate']:.0%},"
        f" busiest unit {r['busiest_share']:.0%}, failed {r['failures']}",
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    out: Path = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    facts, began = machine_facts(), time.monotonic()
    model = _model(args.model, out)
    kv = Kv.of(json.loads((model / "config.json").read_text()), args.kv_mib)
    print(kv.describe())
    with tempfile.TemporaryDirectory(prefix="unitgate-prefix-") as name:
        try:
            found = _bench(args, model, kv, Path(name))
        except RuntimeError as exc:
            print(f"bench prefix: {exc}", file=sys.stderr)
            return 1
        finally:
            _keep_logs(Path(name), out / "prefix-logs")
    rows = [report.row(r) for r in found["results"]]
    print()
    report.print_table(rows)
    took = time.monotonic() - began
    report.write(out, summary.info(args, facts, kv, found, took), rows)
    print(f"took {took / 60:.1f} min")
    return 1 if any(r["failures"] for r in rows) else 0


def _keep_logs(tmp: Path, into: Path) -> None:
    into.mkdir(parents=True, exist_ok=True)
    for log in tmp.glob("*.log"):
        shutil.copy(log, into / log.name)
