"""The stall rule against the builtin engine's own /health, read as the gateway reads it.

A step that hangs in the middle of its layers (a collective that never returns) stops the
leader's `progress` (layers run) and its step count: the gateway's `StallWatch` reports it once
`stall_timeout` has passed with work pending, with chunked prefill too. A step that is merely
slower than `stall_timeout` (a long prefill chunk, a loaded host) keeps `progress` moving
layer by layer and is not a stall, although its step count stands still (CI saw a 2-node unit
ejected for one slow step)."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import replace

import orjson
import torch

from engine.api import GenerationRequest
from engine.model import ByteTokenizer, ModelConfig, Transformer, init_from_seed
from engine.runtime import LeaderEngine
from engine.scheduler import SamplingParams
from gateway.health.kinds.unitgate import parse_health
from gateway.health.result import NodeReport
from gateway.health.verdict import StallWatch

STALL_TIMEOUT = 0.5
HANGS_AT = 3  # the fourth forward: the prompt's fourth chunk of 16
LAYER_S = 0.2  # a slow layer: 4 of them make a step of 0.8 s, past STALL_TIMEOUT


async def drain(engine: LeaderEngine, request: GenerationRequest) -> list[object]:
    return [event async for event in engine.generate(request)]


def wrap_layer(model: Transformer, index: int, before: Callable[[], None]) -> None:
    """Run `before` ahead of every call of layer `index`'s forward."""
    block = model.layers[index]
    real = block.forward

    def forward(*args: object) -> torch.Tensor:
        before()
        out: torch.Tensor = real(*args)
        return out

    block.forward = forward  # type: ignore[method-assign]


def leader_report(engine: LeaderEngine) -> NodeReport:
    """The leader's /health body, parsed by the gateway's `unitgate` kind."""
    return parse_health(200, orjson.dumps(engine.health()), 1.0)


def by_progress(watch: StallWatch, report: NodeReport) -> str | None:
    """What the gateway's verdict feeds the stall watch (`GangVerdict.observe`)."""
    assert report.progress is not None, "the builtin leader reports its progress"
    return watch.observe(report.progress, report.pending, time.monotonic(), report.step)


def engine_with(model: Transformer) -> LeaderEngine:
    return LeaderEngine(model, ByteTokenizer(), model_name="t", prefill_chunk=16).start()


def long_model() -> Transformer:
    return init_from_seed(replace(ModelConfig.tiny(), max_seq_len=512), seed=0, num_slots=2)


async def test_a_step_that_hangs_mid_layers_is_found_stalled() -> None:
    model = long_model()
    release, calls = threading.Event(), itertools.count()
    wrap_layer(model, 2, lambda: next(calls) == HANGS_AT and bool(release.wait(30)))
    engine = engine_with(model)
    request = GenerationRequest("long", tuple(range(1, 201)), SamplingParams(max_tokens=1))
    watch, verdict, steps = StallWatch(STALL_TIMEOUT), None, set()
    try:
        task = asyncio.create_task(drain(engine, request))
        deadline = time.monotonic() + 10
        while verdict is None:
            assert time.monotonic() < deadline, f"no stall reported; steps seen {sorted(steps)}"
            report = leader_report(engine)
            steps.add(report.step)
            verdict = by_progress(watch, report)
            await asyncio.sleep(0.02)
    finally:
        release.set()
    await asyncio.wait_for(task, 30)
    await asyncio.to_thread(engine.shutdown)
    assert verdict.startswith(f"engine stalled: step {HANGS_AT} unchanged for")
    assert verdict.endswith("with 1 pending")


async def test_a_step_slower_than_the_stall_timeout_is_not_a_stall() -> None:
    model = long_model()
    for index in range(len(model.layers)):
        wrap_layer(model, index, lambda: time.sleep(LAYER_S))
    engine = engine_with(model)
    request = GenerationRequest("slow", tuple(range(1, 21)), SamplingParams(max_tokens=2))
    progress_watch, step_watch = StallWatch(STALL_TIMEOUT), StallWatch(STALL_TIMEOUT)
    stalls, step_stalls = [], []
    task = asyncio.create_task(drain(engine, request))
    deadline = time.monotonic() + 30
    while not task.done():
        assert time.monotonic() < deadline, "the request did not finish"
        report = leader_report(engine)
        stalls.append(by_progress(progress_watch, report))
        step_stalls.append(step_watch.observe(report.step, report.pending, time.monotonic()))
        await asyncio.sleep(0.02)
    await task
    await asyncio.to_thread(engine.shutdown)
    assert any(step_stalls), "each step is slower than the stall timeout: the step count stood"
    assert not any(stalls), [s for s in stalls if s]
