"""The command line and the order of the sections: memory first (RSS is read before this
process has freed anything big), then the events, the request path and the workers' share."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

import loadtest.bench.kv_costs
from loadtest.bench.kv_costs import chat, events, memory, report, routing
from loadtest.bench.machine import machine_facts

T = TypeVar("T")
WORKERS = (2, 4, 8)


@dataclass(frozen=True, slots=True)
class Sizes:
    rss_blocks: int  # the index RSS is read at (the configured default)
    traced_blocks: int  # the index tracemalloc follows
    event_tokens: int  # token ids a round of each event shape carries
    steady_blocks: int  # the full index the events are applied to
    prompt_scale: float  # of the requests section 3a tokenizes
    budget_s: float  # CPU a timed call of section 3b/3c gets


FULL = Sizes(1_000_000, 100_000, 65_536, events.STEADY, 1.0, 0.15)
QUICK = Sizes(100_000, 10_000, 16_384, 20_000, 0.2, 0.03)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m loadtest.bench.kv_costs",
        description=loadtest.bench.kv_costs.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", type=Path, required=True, help="DIR/kv_costs.json, DIR/kv_costs.md")
    p.add_argument("--quick", action="store_true", help="smaller sizes: a smoke run")
    p.add_argument("--units", type=int, default=32, help="the fleet of section 4")
    p.add_argument(
        "--blocks-per-unit", type=float, default=2000.0, help="blocks each unit stores a second"
    )
    p.add_argument("--tokenizer", type=Path, help="a folder with tokenizer.json and a template")
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    if args.units < 1 or args.blocks_per_unit <= 0:
        p.error("--units must be at least 1 and --blocks-per-unit above 0")
    return args


def _timed(name: str, step: Callable[[], T], seconds: dict[str, float]) -> T:
    print(f"{name}...", file=sys.stderr, flush=True)
    start = time.perf_counter()
    result = step()
    seconds[name] = round(time.perf_counter() - start, 1)
    return result


def _loads(per_unit: float) -> list[tuple[int, float]]:
    """Section 4's rates: 16-token blocks (GPUs' default), and 128-token blocks (vLLM's CPU
    build) carrying as many tokens."""
    return [(16, per_unit), (128, per_unit * 16 / 128)]


def _run(args: argparse.Namespace, sizes: Sizes, folder: Path) -> dict[str, Any]:
    seconds: dict[str, float] = {}
    seed = args.seed
    rss = _timed("memory (RSS)", lambda: memory.by_rss(sizes.rss_blocks, seed), seconds)
    traced = _timed(
        "memory (tracemalloc)", lambda: memory.by_tracemalloc(sizes.traced_blocks, seed), seconds
    )
    rows = _timed(
        "events",
        lambda: events.run((16, 128), sizes.event_tokens, seed, sizes.steady_blocks),
        seconds,
    )
    if args.tokenizer is None:
        _timed("tokenizer export", lambda: chat.export_smollm2(folder), seconds)
    tokenizer = args.tokenizer or folder
    prompt_rows = _timed(
        "prompt ids",
        lambda: chat.run(tokenizer, chat.SIZES, seed, sizes.prompt_scale),
        seconds,
    )
    budget = sizes.budget_s
    depth_rows = _timed(
        "depths",
        lambda: routing.depths(routing.BLOCK_SIZES, routing.PROMPTS, routing.UNITS, seed, budget),
        seconds,
    )
    estimate_rows = _timed("estimates", lambda: routing.estimates(routing.UNITS, budget), seconds)
    learning_rows = _timed("learning", lambda: routing.learning(budget), seconds)
    return {
        "memory": rss + traced,
        "events": rows,
        "workers": events.worker_share(rows, args.units, _loads(args.blocks_per_unit)),
        "worker_counts": list(WORKERS),
        "prompts": prompt_rows,
        "depths": depth_rows,
        "estimates": estimate_rows,
        "learning": learning_rows,
        "seconds": seconds,
    }


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    sizes = QUICK if args.quick else FULL
    out: dict[str, Any] = {
        "machine": machine_facts(),
        "args": vars(args) | {"out": str(args.out), "tokenizer": str(args.tokenizer or "")},
        "sizes": asdict(sizes),
    }
    with tempfile.TemporaryDirectory(prefix="kv-costs-") as tmp:
        out |= _run(args, sizes, Path(tmp))
    json_path, md_path = report.write(args.out, out)
    print(report.markdown(out))
    print(f"wrote {json_path} and {md_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
