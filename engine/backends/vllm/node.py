"""`unitgate node --backend vllm`: one node of a vLLM unit, leader or follower.

The leader runs vLLM's AsyncLLM in this process behind the project's own leader server, so the
API and the /health contract (with its optional thread listener) are the builtin engine's.
Followers are headless vLLM nodes with their own /health. Either way the node owns everything
vLLM spawns: on any exit it reaps them and removes their shared memory.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

from engine.backends.vllm import require_vllm
from engine.backends.vllm.args import (
    check_known,
    engine_kwargs,
    known_engine_args,
    parse_vllm_args,
    step_timeout,
)
from engine.backends.vllm.env import apply_defaults, clean_shm, node_defaults
from engine.settings import NodeSettings

log = logging.getLogger(__name__)
SHUTDOWN_DEADLINE_S = 60.0  # past this a stuck shutdown ends in os._exit, not a hang


def check_settings(settings: NodeSettings) -> None:
    """What NodeSettings' own checks do not cover; all before the minute-long vLLM start,
    and after `require_vllm`, so a missing vLLM is what a node without it reports."""
    if not Path(settings.model).is_dir():
        raise ValueError(f"--model: the vllm backend loads a model folder, got {settings.model!r}")
    parse_vllm_args(settings.vllm_args)
    if not settings.leader_lost_after > 0:
        raise ValueError(
            f"--leader-lost-after: must be > 0 seconds, got {settings.leader_lost_after}"
        )


def run_node(settings: NodeSettings) -> int:
    require_vllm()  # first: everything below may import vLLM's dependencies
    from engine.backends.vllm.processes import reap_children

    started = time.time()  # shared memory written since then is this node's to clean up
    check_settings(settings)
    own_host = settings.host if settings.is_leader else settings.health_host
    defaults = node_defaults(settings.rank, own_host, step_timeout(settings))
    if own_host in ("", "0.0.0.0", "::"):  # not an address peers can reach: let vLLM pick
        defaults.pop("VLLM_HOST_IP")
    apply_defaults(defaults, os.environ)
    # A misspelt engine argument fails here, in one line, not minutes later in a worker.
    check_known(engine_kwargs(settings), known_engine_args(), "--vllm-args")
    clean_shm()
    # Until the server (or the follower loop) installs its own handlers, SIGTERM must unwind
    # through the `finally` below: the default action would orphan vLLM's processes mid-start.
    signal.signal(signal.SIGTERM, _raise_exit)
    try:
        if settings.role == "follower":
            from engine.backends.vllm.follower import run_follower

            return run_follower(settings)
        return _run_leader(settings)
    finally:
        reap_children(grace=3.0, since=started)


def _raise_exit(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def _run_leader(settings: NodeSettings) -> int:
    import uvloop

    from engine.backends.vllm.leader import start_leader
    from engine.backends.vllm.watchdog import StallWatch
    from engine.server.run import health_at, serve_until_signal

    stalled: list[str] = []

    def on_stall(reason: str) -> None:
        """Fail the unit, then stop like on SIGTERM: the supervisor restarts the whole unit."""
        stalled.append(reason)
        log.error("leader of unit %s: %s; stopping", settings.unit, reason)
        os.kill(os.getpid(), signal.SIGTERM)

    async def lead() -> None:
        leader = await start_leader(settings)
        engine = leader.engine
        watch = StallWatch(engine.health, step_timeout(settings), on_stall)
        watch.start()
        try:
            await serve_until_signal(engine, settings.host, settings.port, health_at(settings))
        finally:
            watch.stop()
            if stalled:
                engine.fail(stalled[0])
            _shutdown_within(leader.shutdown, SHUTDOWN_DEADLINE_S)

    uvloop.run(lead())
    log.info("leader of unit %s stopped", settings.unit)
    return 1 if stalled else 0


def _shutdown_within(shutdown: Callable[[], None], deadline: float) -> None:
    """vLLM's shutdown waits on its processes; one wedged on a dead peer must not keep the
    node alive, so past the deadline the node reaps them and leaves."""
    timer = threading.Timer(deadline, _hard_exit)
    timer.daemon = True
    timer.start()
    try:
        with contextlib.suppress(Exception):
            shutdown()
    finally:
        timer.cancel()


def _hard_exit() -> None:
    from engine.backends.vllm.processes import reap_children

    log.error("vLLM shutdown still running after %g s; exiting", SHUTDOWN_DEADLINE_S)
    reap_children(grace=2.0)  # the shared memory goes with the resource tracker, at exit
    os._exit(1)
