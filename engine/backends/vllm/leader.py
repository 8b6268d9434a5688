"""The leader's vLLM: AsyncLLM in this process with the step counter attached, and vLLM's own
OpenAI server app over it.

The app is what `vllm serve` builds (`build_app`, `init_app_state`): every route and field vLLM
serves (tools, structured output, logprobs, `n`, `return_token_ids`, token-id prompts,
`/v1/responses`, `/v1/messages`, ...), with the `vllm serve` arguments the node was given.
Two things differ from `vllm serve`: the engine is built here, to hand vLLM the stat logger
that counts its iterations into the node's `step`, and the app's `/health` answers the node
contract (vLLM's answers an empty 200).

vLLM's engine core and this node's workers run in child processes; AsyncLLM is the client in
this process and must live on the event loop that serves requests, so it is built inside that
loop. Building it blocks until every node of the unit has joined and the model is loaded.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from engine.backends.vllm.serve_args import build_engine_args
from engine.backends.vllm.stats import step_counter_factory
from engine.runtime.group import first_line
from engine.runtime.health import NodeStats
from engine.settings import NodeSettings

log = logging.getLogger(__name__)
WARM_UP_PROMPT = [1, 2, 3, 4]  # any ids below the vocabulary size: only the step matters


@dataclass(frozen=True, slots=True)
class Leader:
    app: Any  # vLLM's FastAPI app
    health: Callable[[], dict[str, Any]]
    fail: Callable[[str], object]
    shutdown: Callable[[], None]


async def start_leader(settings: NodeSettings, args: argparse.Namespace) -> Leader:
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.engine.async_llm import AsyncLLM

    stats = NodeStats("leader", settings.unit, settings.rank, settings.num_slots)
    built: list[Any] = []
    counter = step_counter_factory(stats, lambda: _pending(built))
    llm = AsyncLLM.from_engine_args(
        build_engine_args(args),
        usage_context=UsageContext.OPENAI_API_SERVER,
        stat_loggers=[counter],
    )
    built.append(llm)
    await llm.reset_mm_cache()  # as `vllm serve` does: no dummy multimodal data kept
    await _warm_up(llm)
    health = _health(llm, stats)
    app = await _build_app(llm, args, health)
    log.info(
        "vLLM leader of unit %s ready: %s, %d nodes",
        settings.unit,
        ", ".join(args.served_model_name),
        settings.world_size,
    )
    return Leader(app, health, stats.mark_unhealthy, llm.shutdown)


async def _build_app(llm: Any, args: argparse.Namespace, health: Callable[[], Any]) -> Any:
    from vllm.entrypoints.launchers.api_server.app_state import init_app_state
    from vllm.entrypoints.launchers.app import build_app

    tasks = await llm.get_supported_tasks()
    app = build_app(args, tasks, llm.model_config)
    await init_app_state(llm, app.state, args, tasks)
    _serve_health(app, health)
    return app


def _serve_health(app: Any, health: Callable[[], dict[str, Any]]) -> None:
    """The API port's /health answers the node contract, as the builtin leader's does: a
    gateway whose unit has no health port of its own probes it there."""
    from starlette.responses import (  # type: ignore[import-not-found, unused-ignore]
        JSONResponse,  # vLLM's dependency
    )

    async def contract() -> Any:
        body = health()
        return JSONResponse(body, status_code=200 if body["status"] == "ok" else 503)

    app.router.routes[:] = [r for r in app.router.routes if getattr(r, "path", "") != "/health"]
    app.add_api_route("/health", contract, methods=["GET"], include_in_schema=False)


def _health(llm: Any, stats: NodeStats) -> Callable[[], dict[str, Any]]:
    """The node contract's body. `pending` is vLLM's own count of requests between
    `generate()` and their end (finished or aborted), read at each call; the running count
    (`kv_slots_used`) is the step counter's, as of the last iteration."""

    def health() -> dict[str, Any]:
        if llm.errored:
            stats.mark_unhealthy(f"vLLM engine dead: {first_line(llm.dead_error)}")
        body = stats.snapshot()
        body["pending"] = int(llm.get_num_unfinished_requests())
        body["kv_slots_used"] = min(body["kv_slots_used"], body["pending"])
        return body

    return health


def _pending(built: list[Any]) -> int:
    return int(built[0].get_num_unfinished_requests()) if built else 0


async def _warm_up(llm: Any) -> None:
    """vLLM's first real step is several seconds slower than the rest (lazy initialisation in
    the workers); paying it before the node announces itself keeps it out of the first client's
    latency and out of the stall check's way."""
    from vllm import SamplingParams
    from vllm.inputs.engine import tokens_input

    prompt = tokens_input(WARM_UP_PROMPT)
    params = SamplingParams(max_tokens=1)
    async for _ in llm.generate(prompt, params, "unitgate-warm-up"):
        pass
