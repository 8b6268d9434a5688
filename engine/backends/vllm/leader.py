"""Starting the leader's vLLM engine: AsyncLLM in this process, with the step counter attached.

vLLM's engine core and this node's workers run in child processes; AsyncLLM is the client in
this process and must live on the event loop that serves requests, so it is built here, inside
that loop. Building it blocks until every node of the unit has joined and the model is loaded.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from engine.api import GenerationRequest
from engine.backends.vllm.args import build_engine_args
from engine.backends.vllm.engine import VllmEngine
from engine.backends.vllm.stats import step_counter_factory
from engine.model.tokenizer import HFTokenizer
from engine.runtime.health import NodeStats
from engine.scheduler import SamplingParams
from engine.settings import NodeSettings

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Leader:
    engine: VllmEngine
    shutdown: Callable[[], None]


async def start_leader(settings: NodeSettings) -> Leader:
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.engine.async_llm import AsyncLLM

    folder = Path(settings.model)
    stats = NodeStats("leader", settings.unit, settings.rank, settings.num_slots)
    built: list[VllmEngine] = []
    counter = step_counter_factory(stats, lambda: built[0].pending if built else 0)
    llm = AsyncLLM.from_engine_args(
        build_engine_args(settings),
        usage_context=UsageContext.OPENAI_API_SERVER,
        stat_loggers=[counter],
    )
    name = settings.served_model_name or folder.name
    engine = VllmEngine(llm, HFTokenizer(folder), name, stats, llm.model_config.max_model_len)
    built.append(engine)
    await _warm_up(engine)
    log.info("vLLM leader of unit %s ready: %s, %d nodes", settings.unit, name, settings.world_size)
    return Leader(engine, llm.shutdown)


async def _warm_up(engine: VllmEngine) -> None:
    """vLLM's first real step is several seconds slower than the rest (lazy initialisation in
    the workers); paying it before the node announces itself keeps it out of the first client's
    latency and out of the stall check's way."""
    prompt = tuple(engine.tokenizer.encode("warm up", add_bos=True))
    request = GenerationRequest("unitgate-warm-up", prompt, SamplingParams(max_tokens=1))
    async for event in engine.generate(request):
        if event.error is not None:
            raise RuntimeError(f"vLLM warm-up request failed: {event.error}")
