"""vLLM's engine iterations, counted into the node's health `step`.

The gateway's stall detection reads the leader's `step` and `pending`: work pending while
`step` stands still means the unit is stuck (a follower hung in a collective). So `step` must
move only when the engine really completes an iteration. vLLM's engine core sends one batch of
outputs with its scheduler stats per iteration, and AsyncLLM hands each batch to every stat
logger's `record()`: that call is the iteration hook.

The stat logger interface is marked unstable by vLLM; this file is the only place that knows it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from vllm.v1.metrics.loggers import StatLoggerBase

from engine.runtime.health import NodeStats


class StepCounter(StatLoggerBase):
    """Counts iterations that produced outputs; mirrors the scheduler's queue lengths."""

    def __init__(self, stats: NodeStats, pending: Callable[[], int]) -> None:
        self._stats, self._pending = stats, pending

    def record(
        self,
        scheduler_stats: Any,
        iteration_stats: Any,
        mm_cache_stats: Any = None,
        engine_idx: int = 0,
    ) -> None:
        running = 0 if scheduler_stats is None else int(scheduler_stats.num_running_reqs)
        if iteration_stats is not None:  # the engine ran a step that produced tokens
            self._stats.record_step(self._pending(), running)
        else:
            self._stats.set_load(self._pending(), running)

    def log_engine_initialized(self) -> None:
        """Nothing to say: the node announces itself once its server listens."""


def step_counter_factory(
    stats: NodeStats, pending: Callable[[], int]
) -> Callable[[Any, int], StepCounter]:
    """vLLM builds its loggers itself, from (vllm_config, engine_index)."""

    def make(vllm_config: Any, engine_index: int = 0) -> StepCounter:
        return StepCounter(stats, pending)

    return make
