"""`python -m loadtest.bench.prefix_cache`: what the builtin engine's prefix cache saves a
request whose prompt starts cached, and what it costs one that does not.

SmolLM2-135M-Instruct (the packaged GGUF, `gguf` weights, one node, one torch thread, 8 KV
slots, max_seq_len 2,048, the default prefill chunk: `make run`'s per-node settings) in
process, through `LeaderEngine.generate`, one request at a time. Each round, side by side:

- cold, cache off: a `--prefix`-token prompt no request had before (a round's own first
  block), plus a 16-token question, on an engine with `prefix_caching=False`;
- cold, cache on: the same prompt on an engine with the cache on (nothing of it cached:
  its first block is the round's own);
- warm: the same `--prefix` tokens and another 16-token question, right after: the prefix is
  cached, the question computed.

Reported: each kind's median time to first token over the rounds, and the ratios the issue
aims at (warm / cold: at most 0.2; cold with the cache / cold without: at most 1.05). Both
engines share one model (the one not serving is stopped; which goes first alternates by
round), so the two colds differ only in the scheduler's bookkeeping: hashing and the pool.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

from engine.api import GenerationRequest
from engine.runtime.leader import LeaderEngine
from engine.scheduler import SamplingParams
from loadtest.bench.chunked_prefill import POLICY, load

QUESTION = 16  # tokens after the shared prefix


def prompts(tokenizer: Any, prefix: int, round_: int) -> tuple[tuple[int, ...], ...]:
    """This round's cold and warm prompts: the same `prefix` tokens (led by the round's own
    customer number, so no other round shares a block), then two different questions."""
    head = f"Customer {round_:04d} of the shop asks. " + POLICY * (prefix // 30 + 1)
    shared = tuple(tokenizer.encode(head))[:prefix]
    assert len(shared) == prefix, f"the policy text makes {len(shared)} tokens, not {prefix}"
    questions = [
        tuple(tokenizer.encode(f" Question {round_}-{k}: may I return it? " * 3)) for k in (0, 1)
    ]
    return tuple(shared + q[:QUESTION] for q in questions)


async def ttft(engine: LeaderEngine, prompt: tuple[int, ...]) -> float:
    """ms from the request to its first token."""
    request = GenerationRequest(f"r{time.monotonic_ns()}", prompt, SamplingParams(max_tokens=1))
    start = time.perf_counter()
    async for event in engine.generate(request):
        if event.token_id is not None:
            return (time.perf_counter() - start) * 1e3
    raise RuntimeError("no token came")


async def run(model: Any, tokenizer: Any, prefix: int, rounds: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {"cold, cache off": [], "cold, cache on": [], "warm": []}

    def engine(caching: bool) -> LeaderEngine:
        return LeaderEngine(model, tokenizer, model_name="smollm2", prefix_caching=caching).start()

    for r in range(rounds + 1):  # round 0 warms the process up and is not counted
        cold, warm = prompts(tokenizer, prefix, r)
        measured: dict[str, float] = {}
        for caching in (False, True) if r % 2 else (True, False):  # neither always first
            served = engine(caching)
            try:
                measured[f"cold, cache {'on' if caching else 'off'}"] = await ttft(served, cold)
                if caching:
                    measured["warm"] = await ttft(served, warm)
                    hits = served.health().get("prefix_cache_hits", 0)
                    assert hits >= prefix - 16, f"round {r}: only {hits} tokens were cached"
            finally:
                await asyncio.to_thread(served.shutdown)
        if r:
            for key, values in times.items():
                values.append(measured[key])
    return times


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.bench.prefix_cache", description=__doc__)
    p.add_argument("--prefix", type=int, default=1024, help="cached prompt tokens (1024)")
    p.add_argument("--rounds", type=int, default=8, help="rounds counted (8)")
    args = p.parse_args(argv)
    model, tokenizer = load()
    times = asyncio.run(run(model, tokenizer, args.prefix, args.rounds))
    median = {key: statistics.median(values) for key, values in times.items()}
    load_avg = os.getloadavg()[0]
    print(
        f"TTFT ms, a {args.prefix}+{QUESTION}-token prompt, SmolLM2 gguf, 1 node, 1 thread, "
        f"{args.rounds} rounds; load average {load_avg:.1f}"
    )
    for key, values in times.items():
        spread = ", ".join(f"{v:.0f}" for v in values)
        print(f"  {key:<16} median {median[key]:7.0f}   ({spread})")
    warm = median["warm"] / median["cold, cache on"]
    cost = median["cold, cache on"] / median["cold, cache off"]
    print(f"  warm / cold: {warm:.3f} (aim <= 0.2)")
    print(f"  cold with the cache / without: {cost:.3f} (aim <= 1.05)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
