"""`unitgate up`: start the config's loopback units of the builtin engine, then the gateway in
this process, print where everything is, and on Ctrl-C/SIGTERM stop it all in order.

Order matters both ways. At start the gateway comes up while the units still load, and
`ready` is printed only once the gateway itself routes to every local unit. At stop the
gateway drains first (clients get their answers or a clean end), then the units go, leaders
first so followers are told STOP instead of timing out in a collective.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
import os
import secrets
import signal
import sys
import tempfile
from pathlib import Path

from engine.backends.vllm import VllmMissing, require_vllm
from engine.backends.vllm.args import check_known, known_engine_args
from engine.up.backoff import Backoff
from engine.up.plan import EngineOptions, Plan, PlanError, plan_units
from engine.up.processes import Launcher, node_env
from engine.up.ready import announce, wait_routable
from engine.up.supervisor import UnitSupervisor
from gateway.api import Config, ConfigError, raise_fd_limit, read_tokens, running

log = logging.getLogger("unitgate.up")
READY_TIMEOUT = 180.0  # first start on a small machine: every node imports torch at once


def run_up(config: Config, log_dir: Path | None = None) -> int:
    """The command's body; returns the exit code (2 for a config it cannot run)."""
    if importlib.util.find_spec("torch") is None:
        print(
            "unitgate up: the builtin engine needs the engine extra: "
            "pip install -e '.[engine]' -c constraints.txt (or run `unitgate up --simulated`)",
            file=sys.stderr,
        )
        return 2
    if config.gateway.worker_count > 1:
        print(
            f"unitgate up: [gateway].workers = {config.gateway.workers!r}: `up` runs the gateway "
            "inside its own process, so with one worker; `unitgate gateway` runs more",
            file=sys.stderr,
        )
        return 2
    try:
        plan = _local_plan(config)
        _check_vllm_units(plan)
    except (PlanError, VllmMissing) as exc:
        print(f"unitgate up: {exc}", file=sys.stderr)
        return 2
    generated = _ensure_admin_token(config)
    logs = log_dir or Path(tempfile.mkdtemp(prefix="unitgate-up-"))
    try:
        logs.mkdir(parents=True, exist_ok=True)  # --log-dir may name a folder to create
    except OSError as exc:
        print(f"unitgate up: --log-dir {logs}: {exc.strerror}", file=sys.stderr)
        return 2
    launcher = Launcher(EngineOptions(), logs, node_env(os.environ, [config.admin.token_env]))
    return _run_loop(config, plan, launcher, generated)


def _local_plan(config: Config) -> Plan:
    plan = plan_units(config)
    if not plan.units:
        raise PlanError("no unit of the config is on loopback: nothing to start here")
    for unit in plan.skipped:
        log.info("unit %s: not on loopback, not started here (the gateway still routes)", unit)
    return plan


def _check_vllm_units(plan: Plan) -> None:
    """A vLLM unit that cannot start should fail here, once, with the unit's name, not in a
    restart loop with the reason buried in a node log."""
    units = [u for u in plan.units if u.leader.backend == "vllm"]
    if not units:
        return
    require_vllm()
    known = known_engine_args()
    for unit in units:
        try:
            check_known(json.loads(unit.leader.engine_args), known, "engine_args")
        except ValueError as exc:
            raise PlanError(f"unit {unit.unit}: {exc}") from None


def _ensure_admin_token(config: Config) -> str | None:
    """The admin API refuses to run without a token; a demo should not make the user invent
    one, so a run without one gets a fresh token (returned, to be printed)."""
    if not config.admin.enabled or read_tokens(config.admin, os.environ) is not None:
        return None
    token = secrets.token_urlsafe(24)
    os.environ[config.admin.token_env] = token
    return token


def _run_loop(config: Config, plan: Plan, launcher: Launcher, token: str | None) -> int:
    import uvloop

    raise_fd_limit()
    try:
        return uvloop.run(_up(config, plan, launcher, token))
    except ConfigError as exc:  # found at gateway start-up (admin token, state file)
        print(f"unitgate up: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a listener's port is taken
        print(f"unitgate up: {exc}", file=sys.stderr)
        return 1


async def _up(config: Config, plan: Plan, launcher: Launcher, token: str | None) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    supervisors = [UnitSupervisor(unit, launcher, Backoff()) for unit in plan.units]
    tasks = [asyncio.create_task(s.run(), name=f"unit-{s.plan.unit}") for s in supervisors]
    try:
        async with running(config) as gateway:
            code = await wait_routable(gateway, plan, stop, READY_TIMEOUT, launcher.log_dir)
            if code == 0 and not stop.is_set():
                announce(config, gateway, plan, launcher.log_dir, token)
                await stop.wait()
            log.info("stopping: gateway drains for up to %g s", config.gateway.shutdown_timeout)
            gateway.draining = True
    finally:
        await _stop_units(tasks)
    log.info("every unit stopped")
    return code


async def _stop_units(tasks: list[asyncio.Task[None]]) -> None:
    """Each supervisor stops its own unit when cancelled (leaders, then followers)."""
    for task in tasks:
        task.cancel()
    for result in await asyncio.gather(*tasks, return_exceptions=True):
        if isinstance(result, Exception):
            log.error("unit supervisor failed: %r", result)
