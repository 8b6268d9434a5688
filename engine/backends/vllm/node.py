"""`unitgate node --backend vllm`: one node of a vLLM unit, leader or follower.

The leader runs vLLM's AsyncLLM in this process behind vLLM's own OpenAI server, with the
`vllm serve` arguments of `--vllm-args`; the node contract is on its /health (and on the thread
listener of `--health-port`). Followers are headless vLLM nodes with their own /health. Either
way the node owns everything vLLM spawns: on any exit it reaps them and removes their shared
memory.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from argparse import Namespace
from collections.abc import Callable
from pathlib import Path

from engine.backends.vllm import require_vllm
from engine.backends.vllm.args import parse_vllm_args, step_timeout
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
    from engine.backends.vllm.serve_args import serve_args

    started = time.time()  # shared memory written since then is this node's to clean up
    check_settings(settings)
    own_host = settings.host if settings.is_leader else settings.health_host
    defaults = node_defaults(settings.rank, own_host, step_timeout(settings))
    if own_host in ("", "0.0.0.0", "::"):  # not an address peers can reach: let vLLM pick
        defaults.pop("VLLM_HOST_IP")
    apply_defaults(defaults, os.environ)
    # A misspelt argument or a bad value fails here, in one line, not minutes later in a worker.
    args = serve_args(settings)
    clean_shm()
    # Until the server (or the follower loop) installs its own handlers, SIGTERM must unwind
    # through the `finally` below: the default action would orphan vLLM's processes mid-start.
    signal.signal(signal.SIGTERM, _raise_exit)
    try:
        if settings.role == "follower":
            from engine.backends.vllm.follower import run_follower

            return run_follower(settings, args)
        return _run_leader(settings, args)
    finally:
        reap_children(grace=3.0, since=started)


def _raise_exit(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def _run_leader(settings: NodeSettings, args: Namespace) -> int:
    import uvloop

    from engine.backends.vllm.leader import start_leader
    from engine.backends.vllm.server import bind, serve_until_signal
    from engine.backends.vllm.watchdog import StallWatch
    from engine.runtime.leader_health import LeaderHealth
    from engine.server.run import health_at

    stalled: list[str] = []

    def on_stall(reason: str) -> None:
        """Fail the unit, then stop like on SIGTERM: the supervisor restarts the whole unit."""
        stalled.append(reason)
        log.error("leader of unit %s: %s; stopping", settings.unit, reason)
        os.kill(os.getpid(), signal.SIGTERM)

    async def lead() -> None:
        leader = await start_leader(settings, args)
        watch = StallWatch(leader.health, step_timeout(settings), on_stall).start()
        try:
            listener = LeaderHealth(leader.health, health_at(settings))
            await serve_until_signal(leader.app, args, sock, listener)
        finally:
            watch.stop()
            _record_failure(leader.health(), stalled)
            if stalled:
                leader.fail(stalled[0])
            _shutdown_within(leader.shutdown, SHUTDOWN_DEADLINE_S)

    sock = bind(settings.host, settings.port)  # a taken port fails now, not after the start
    try:
        uvloop.run(lead())
    finally:
        sock.close()
    log.info("leader of unit %s stopped", settings.unit)
    return 1 if stalled else 0


def _record_failure(health: dict[str, object], stalled: list[str]) -> None:
    """vLLM's server stops by itself once its engine is dead; that too is a failed unit."""
    if not stalled and health["status"] != "ok":
        stalled.append(str(health.get("reason", health["status"])))


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
