"""`python -m loadtest.bench.chunked_prefill`: what a long prompt costs running streams.

SmolLM2-135M-Instruct (the packaged GGUF, `gguf` weights, one node, one torch thread, 8 KV
slots, max_seq_len 2,048: `make run`'s per-node settings) in process, no HTTP. Two parts:

1. Step cost per chunk size. Slots 0-3 hold short prompts and decode one token a step; slot
   4 prefills a `--prompt`-token prompt (1,500 by default) a chunk at a time beside them,
   the step `LeaderEngine` runs with `prefill_chunk` = the chunk size. Per chunk size
   (64, 128, 256, 512, and the whole prompt in one step, i.e. no chunking): the mean and the
   longest step while the prompt is fed, and the whole prompt's time; beside them, a decode
   step of the 4 alone. Times are the thread's CPU time (torch runs on the calling thread
   with one thread), so other work on the machine stretches them less than wall time.

2. Inter-token latency of 4 running streams while the long prompt arrives, chunking off
   (`prefill_chunk` = max_seq_len) and on (the default), through `LeaderEngine.generate`:
   4 greedy streams decode; once each has 8 tokens the long prompt is submitted; the gaps
   between the 4 streams' tokens are recorded from then until the long prompt's first token,
   plus as many gaps again after it. Reported: ITL p50, p99 and max, the long prompt's time
   to first token, and the engine's longest step (the stall rule's `stall_timeout`, 1.5 s by
   default, watches the step count: a step longer than that with work pending is "stalled").
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

from engine.api import GenerationRequest
from engine.runtime.leader import LeaderEngine
from engine.scheduler import DEFAULT_PREFILL_CHUNK, SamplingParams

CHUNKS = (64, 128, 256, 512)
MAX_SEQ_LEN = 2048
STREAMS = 4
POLICY = (
    "Returns are accepted within 30 days of delivery for unworn items in their original "
    "packaging; sale items can be exchanged but not refunded. Shipping is free over $50. "
)


def load() -> tuple[Any, Any]:
    import torch

    from engine.device import weight_dtype
    from engine.model import TPContext
    from engine.model.gguf import GGUFFile, gguf_tokenizer, load_gguf, packaged_file

    torch.set_num_threads(1)
    file = GGUFFile(packaged_file("smollm2"))
    model = load_gguf(
        file,
        TPContext(),
        num_slots=8,
        max_seq_len=MAX_SEQ_LEN,
        weight_dtype=weight_dtype("gguf", torch.float32),
    )
    return model, gguf_tokenizer(file)


def long_prompt(tokenizer: Any, tokens: int) -> tuple[int, ...]:
    """A shop assistant's policy text as the system prompt, cut to `tokens` ids."""
    system = POLICY * (tokens // 30 + 1)
    chat = [{"role": "system", "content": system}, {"role": "user", "content": "Can I return?"}]
    ids = tuple(tokenizer.apply_chat_template(chat))
    return ids[-tokens:]


def step_costs(model: Any, prompt: tuple[int, ...]) -> dict[str, float | list[float]]:
    """ms per step: a decode of the 4 alone, and per chunk size the prompt's steps."""
    for slot in range(STREAMS):
        model([(slot, list(prompt[:16]), 0)])
    pos = [16] * STREAMS
    out: dict[str, float | list[float]] = {}

    def decode_entries() -> list[tuple[int, list[int], int]]:
        return [(slot, [42], pos[slot]) for slot in range(STREAMS)]

    times = []
    for _ in range(20):
        t0 = time.thread_time()
        model(decode_entries())
        times.append((time.thread_time() - t0) * 1e3)
    out["decode"] = statistics.median(times)
    for chunk in (*CHUNKS, len(prompt)):
        steps = []
        for start in range(0, len(prompt), chunk):
            entries = [*decode_entries(), (STREAMS, list(prompt[start : start + chunk]), start)]
            t0 = time.thread_time()
            model(entries)
            steps.append((time.thread_time() - t0) * 1e3)
        out[str(chunk)] = steps
    return out


async def itl_run(engine: LeaderEngine, prompt: tuple[int, ...]) -> dict[str, float]:
    """4 streams decode; the long prompt arrives; each stream stops 8 tokens after the long
    prompt's first token."""
    greedy = SamplingParams(max_tokens=1500, temperature=0.0, ignore_eos=True)
    stamps: list[list[float]] = [[] for _ in range(STREAMS)]
    first, warm = asyncio.Event(), asyncio.Event()

    async def stream(i: int) -> None:
        request = GenerationRequest(f"s{i}-{time.monotonic_ns()}", prompt[:16], greedy)
        after = 0
        async for event in engine.generate(request):
            if event.token_id is None:
                continue
            stamps[i].append(time.perf_counter())
            if min(len(s) for s in stamps) >= 8:
                warm.set()
            after += first.is_set()
            if after == 8:
                engine.abort(request.request_id)

    tasks = [asyncio.create_task(stream(i)) for i in range(STREAMS)]
    await warm.wait()  # every stream has 8 tokens: all 4 decode
    t_arrive = time.perf_counter()
    once = SamplingParams(max_tokens=1, temperature=0.0)
    async for _ in engine.generate(GenerationRequest(f"long-{time.monotonic_ns()}", prompt, once)):
        break
    t_first = time.perf_counter()
    first.set()
    await asyncio.gather(*tasks)
    return _itl(stamps, t_arrive, t_first)


def _itl(stamps: list[list[float]], t_arrive: float, t_first: float) -> dict[str, float]:
    """Gaps between consecutive tokens of each stream from the long prompt's arrival on."""
    gaps: list[float] = []
    for s in stamps:
        after = [t for t in s if t >= t_arrive]
        before = [t for t in s if t < t_arrive][-1:]
        seq = before + after
        gaps += [(b - a) * 1e3 for a, b in itertools.pairwise(seq)]
    gaps.sort()
    return {
        "p50": statistics.median(gaps),
        "p99": gaps[min(len(gaps) - 1, int(0.99 * len(gaps)))],
        "max": gaps[-1],
        "ttft": (t_first - t_arrive) * 1e3,
    }


async def itl(model: Any, tokenizer: Any, prompt: tuple[int, ...], chunk: int) -> dict[str, float]:
    longest = [0.0]

    def on_step(start: int, end: int) -> None:
        longest[0] = max(longest[0], (end - start) / 1e6)

    engine = LeaderEngine(
        model, tokenizer, model_name="smollm2", prefill_chunk=chunk, on_step=on_step
    ).start()
    try:
        result = await itl_run(engine, prompt)
    finally:
        await asyncio.to_thread(engine.shutdown)
    return {**result, "longest_step": longest[0]}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m loadtest.bench.chunked_prefill", description=__doc__
    )
    p.add_argument("--prompt", type=int, default=1500, help="the long prompt's tokens (1500)")
    p.add_argument("--skip-steps", action="store_true", help="part 2 only")
    p.add_argument(
        "--itl-chunks",
        type=lambda text: [int(c) for c in text.split(",")],
        default=[DEFAULT_PREFILL_CHUNK],
        help=f"part 2: the chunk sizes measured beside chunking off ({DEFAULT_PREFILL_CHUNK})",
    )
    args = p.parse_args(argv)
    model, tokenizer = load()
    prompt = long_prompt(tokenizer, args.prompt)
    if not args.skip_steps:
        print_step_costs(step_costs(model, prompt), len(prompt))
    busy = f"load average {os.getloadavg()[0]:.1f}"
    print(f"ITL ms of {STREAMS} streams while a {len(prompt)}-token prompt arrives; {busy}")
    for chunk in (MAX_SEQ_LEN, *args.itl_chunks):
        r = asyncio.run(itl(model, tokenizer, prompt, chunk))
        name = "off" if chunk == MAX_SEQ_LEN else f"on, {chunk}"
        print(
            f"  chunking {name:>7}: p50 {r['p50']:6.1f}  p99 {r['p99']:7.1f}  max {r['max']:7.1f}"
            f"  long prompt TTFT {r['ttft']:6.0f}  longest step {r['longest_step']:6.0f}"
        )
    return 0


def print_step_costs(costs: dict[str, float | list[float]], prompt_len: int) -> None:
    head = f"{STREAMS} decodes + a chunk of a {prompt_len}-token prompt"
    print(f"step CPU ms, {head}, 1 thread; load average {os.getloadavg()[0]:.1f}")
    print(f"  decode of {STREAMS} alone: {costs['decode']:.1f}")
    for chunk in (*CHUNKS, prompt_len):
        steps = costs[str(chunk)]
        assert isinstance(steps, list)
        row = f"mean {statistics.mean(steps):7.1f}  max {max(steps):7.1f}"
        print(f"  chunk {chunk:>5}: {row}  whole prompt {sum(steps):7.0f} ({len(steps)} steps)")


if __name__ == "__main__":
    sys.exit(main())
