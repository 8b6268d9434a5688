"""`python -m loadtest.bench.structured`: what constrained decoding costs the builtin engine.

Decode tokens/s of SmolLM2-135M-Instruct (the packaged GGUF, `gguf` weights, one node, one
torch thread) through the leader's whole path (scheduler, grammar masks, sampler), at batch 1
and 8, with a `json_schema` grammar and without, side by side in one run (the two alternate,
each figure the best of `--rounds`). The schema asks for at least 1,000 product objects, so
the grammar never lets an answer end early and both arms generate exactly `--tokens` tokens
per request (greedy); a decode rate is the tokens after each request's first divided by the
time from the batch's last first token to its end (the prefill is not in it).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Sequence
from typing import Any

from engine.api import GenerationRequest
from engine.grammar import json_schema_grammar
from engine.runtime.leader import LeaderEngine
from engine.scheduler import SamplingParams

BATCHES = (1, 8)
QUESTION = [{"role": "user", "content": "List running shoes for flat feet as JSON."}]
SCHEMA = {
    "type": "array",
    "minItems": 1000,
    "items": {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "price": {"type": "number", "minimum": 0},
            "in_stock": {"type": "boolean"},
        },
        "required": ["name", "price", "in_stock"],
        "additionalProperties": False,
    },
}


def start_engine() -> LeaderEngine:
    import torch

    from engine.device import weight_dtype
    from engine.model import TPContext
    from engine.model.gguf import GGUFFile, gguf_tokenizer, load_gguf, packaged_file

    torch.set_num_threads(1)
    file = GGUFFile(packaged_file("smollm2"))
    model = load_gguf(
        file,
        TPContext(),
        num_slots=max(BATCHES),
        max_seq_len=1024,
        weight_dtype=weight_dtype("gguf", torch.float32),
    )
    return LeaderEngine(model, gguf_tokenizer(file), model_name="smollm2").start()


async def decode_rate(engine: LeaderEngine, batch: int, tokens: int, grammar: str | None) -> float:
    prompt = tuple(engine.tokenizer.apply_chat_template(QUESTION))
    params = SamplingParams(max_tokens=tokens, temperature=0.0)
    firsts: list[float] = []

    async def one(i: int) -> int:
        request = GenerationRequest(f"r{i}-{time.monotonic_ns()}", prompt, params, grammar=grammar)
        count = 0
        async for event in engine.generate(request):
            if event.error is not None:
                raise RuntimeError(event.error)
            if event.token_id is not None:
                count += 1
                if count == 1:
                    firsts.append(time.perf_counter())
        if count != tokens:
            raise RuntimeError(f"a request ended after {count} of {tokens} tokens")
        return count - 1

    decoded = sum(await asyncio.gather(*(one(i) for i in range(batch))))
    return decoded / (time.perf_counter() - max(firsts))


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    engine = await asyncio.to_thread(start_engine)
    grammar = json_schema_grammar(SCHEMA, strict=True)
    engine.check_grammar(grammar)  # builds the grammar backend before anything is timed
    out: dict[str, Any] = {}
    try:
        for batch in BATCHES:
            await decode_rate(engine, batch, 8, grammar)  # warm up both paths
            plain, constrained = [], []
            for _ in range(args.rounds):
                plain.append(await decode_rate(engine, batch, args.tokens, None))
                constrained.append(await decode_rate(engine, batch, args.tokens, grammar))
            out[f"b{batch}"] = (max(plain), max(constrained))
    finally:
        await asyncio.to_thread(engine.shutdown)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.bench.structured", description=__doc__)
    p.add_argument("--tokens", type=int, default=64, help="tokens per request (64)")
    p.add_argument("--rounds", type=int, default=3, help="best of this many per arm (3)")
    args = p.parse_args(argv)
    results = asyncio.run(measure(args))
    print("decode tokens/s, SmolLM2 gguf, 1 thread: none / json_schema / ratio")
    for batch in BATCHES:
        plain, constrained = results[f"b{batch}"]
        print(f"  batch {batch}: {plain:7.1f} / {constrained:7.1f} / {constrained / plain:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
