"""A stall stays a stall with chunked prefill: a step that hangs in the middle of a long
prompt stops the step count, and the gateway's stall rule (its `StallWatch`, fed the leader's
/health) reports it once `stall_timeout` has passed with the prompt pending."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from dataclasses import replace

import torch

from engine.api import GenerationRequest
from engine.model import ByteTokenizer, ModelConfig, init_from_seed
from engine.runtime import LeaderEngine
from engine.scheduler import SamplingParams
from gateway.health.verdict import StallWatch

STALL_TIMEOUT = 0.5
HANGS_AT = 3  # the fourth forward: the prompt's fourth chunk of 16


async def drain(engine: LeaderEngine, request: GenerationRequest) -> list[object]:
    return [event async for event in engine.generate(request)]


async def test_a_step_that_hangs_mid_prompt_is_still_found_stalled() -> None:
    model = init_from_seed(replace(ModelConfig.tiny(), max_seq_len=512), seed=0, num_slots=2)
    release, calls, real = threading.Event(), itertools.count(), model.forward

    def forward(batch: list[tuple[int, list[int], int]]) -> torch.Tensor:
        if next(calls) == HANGS_AT:
            release.wait(30)
        out: torch.Tensor = real(batch)
        return out

    model.forward = forward  # type: ignore[method-assign]
    engine = LeaderEngine(model, ByteTokenizer(), model_name="t", prefill_chunk=16).start()
    request = GenerationRequest("long", tuple(range(1, 201)), SamplingParams(max_tokens=1))
    watch, verdict, steps = StallWatch(STALL_TIMEOUT), None, set()
    try:
        task = asyncio.create_task(drain(engine, request))
        deadline = time.monotonic() + 10
        while verdict is None:
            assert time.monotonic() < deadline, f"no stall reported; steps seen {sorted(steps)}"
            health = engine.health()
            steps.add(health["step"])
            verdict = watch.observe(health["step"], health["pending"], time.monotonic())
            await asyncio.sleep(0.02)
    finally:
        release.set()
    await asyncio.wait_for(task, 30)
    await asyncio.to_thread(engine.shutdown)
    assert verdict.startswith(f"engine stalled: step {HANGS_AT} unchanged for")
    assert verdict.endswith("with 1 pending")
