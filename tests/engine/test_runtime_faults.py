"""Unit failures: a follower dies under the leader, the leader dies under a follower, and the
clean STOP path. Every wait is bounded by a short collective timeout."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest

from engine.api import GenerationRequest, TokenEvent
from engine.scheduler import SamplingParams
from gateway.base.ports import free_port
from tests.engine.test_runtime_support import (
    PROMPT,
    get_health,
    kill_all,
    spawn_node,
    start_unit,
)

pytestmark = pytest.mark.slow
TIMEOUT = 3.0
# Tensor parallelism (the step broadcast), and two pipeline stages (step messages and
# activations sent point to point): the same failures must show the same way.
SHAPES = pytest.mark.parametrize("shape", [(), ("--pp", "2")], ids=["tp", "pp"])


@SHAPES
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSTOP], ids=["killed", "hung"])
async def test_follower_lost_fails_the_leader_within_the_timeout(
    tmp_path: Path, sig: signal.Signals, shape: tuple[str, ...]
) -> None:
    """Killed: the connection closes at once. Hung (SIGSTOP): only Gloo's timeout can tell."""
    engine, follower = start_unit(tmp_path, TIMEOUT, shape=shape)
    try:
        request = GenerationRequest("k1", PROMPT, SamplingParams(max_tokens=450, ignore_eos=True))
        events: list[TokenEvent] = []
        started = 0.0
        async with asyncio.timeout(TIMEOUT + 10):
            async for event in engine.generate(request):
                events.append(event)
                if len(events) == 3:
                    os.kill(follower.proc.pid, sig)
                    started = time.monotonic()
        elapsed = time.monotonic() - started
        assert events[-1].finish_reason == "error" and events[-1].error, events[-1]
        assert elapsed < TIMEOUT + 2
        health = engine.health()
        assert health["status"] == "unhealthy" and health["reason"]
        late = [e async for e in engine.generate(GenerationRequest("k2", PROMPT, request.params))]
        assert len(late) == 1 and late[0].finish_reason == "error"
    finally:
        kill_all(follower)
        engine.shutdown(timeout=TIMEOUT)


@SHAPES
def test_leader_stop_and_leader_loss(tmp_path: Path, shape: tuple[str, ...]) -> None:
    """Two units side by side: one leader is stopped (SIGTERM -> STOP), one is SIGKILLed."""
    nodes = []
    try:
        for name in ("stop", "kill"):
            (tmp_path / name).mkdir()
            master = f"127.0.0.1:{free_port()}"
            flags = ("--collective-timeout", str(TIMEOUT), *shape)
            nodes.append(spawn_node(tmp_path / name, "leader", 0, 2, master, *flags))
            nodes.append(spawn_node(tmp_path / name, "follower", 1, 2, master, *flags))
        stop_leader, stop_follower, kill_leader, kill_follower = nodes
        for node in nodes:
            node.health_port()
        assert get_health(stop_leader.health_port())[1]["role"] == "leader"
        stop_leader.proc.send_signal(signal.SIGTERM)
        kill_leader.proc.kill()
        assert stop_follower.wait(TIMEOUT + 5) == 0, stop_follower.log()
        assert stop_leader.wait(TIMEOUT + 5) == 0, stop_leader.log()
        assert kill_follower.wait(TIMEOUT + 5) != 0
        assert "lost the leader" in kill_follower.log()
    finally:
        kill_all(*nodes)
