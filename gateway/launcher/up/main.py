"""`unitgate up`: start the config's loopback units of the builtin engine, then the gateway in
this process, print where everything is, and on Ctrl-C/SIGTERM stop it all in order.

Order matters both ways. At start the gateway comes up while the units still load, and
`ready` is printed only once the gateway itself routes to every local unit. At stop the
gateway drains first (clients get their answers or a clean end), then the units go, leaders
first so followers are told STOP instead of timing out in a collective.

Units of the vLLM backend publish their KV cache events on Unix sockets in a folder of the
run only its user may enter, and the gateway is told where to read them and the model's
tokenizer (kv_events.py): routing by what each unit has cached works from the first request.

With `--replicas N` the run is a local fleet: a redis-server first (redis_server.py), then the
units, then N gateways sharing admin state through it, this process's gateway as replica 0
and N-1 child replicas (replicas.py, replica.py) on the ports fleet.py lays out; `ready` once
every replica routes to every unit. At the stop every gateway drains at once, then the units
stop, then the store.

With `--simulated` (any number of replicas) the units are one simulator process instead
(simulated.py), serving every unit of the config as loaded; the rest is the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import logging
import os
import secrets
import signal
import sys
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path

from engine.backends.vllm import VllmMissing, require_vllm
from engine.backends.vllm.args import check_known, known_engine_args
from gateway.api import Config, ConfigError, Gateway, raise_fd_limit, read_tokens, running
from gateway.launcher.up.backoff import Backoff
from gateway.launcher.up.fleet import ReplicaPorts, replica_config, replica_ports, runs_store
from gateway.launcher.up.kv_events import (
    SUN_PATH_MAX,
    SocketFolder,
    event_units,
    kv_missing,
    publishing_here,
    socket_folder,
    untokenized,
    with_kv_events,
)
from gateway.launcher.up.plan import EngineOptions, Plan, PlanError, plan_simulated, plan_units
from gateway.launcher.up.ports import check_free
from gateway.launcher.up.processes import Launcher, node_env
from gateway.launcher.up.ready import announce, describe_units, wait_fleet
from gateway.launcher.up.redis_server import (
    INSTALL_HINT,
    LocalRedis,
    StoreFailed,
    find_redis_server,
)
from gateway.launcher.up.replicas import ReplicaLauncher, ReplicaSupervisor, Where
from gateway.launcher.up.simulated import SimulatedUnits
from gateway.launcher.up.tokenizers import export_tokenizers
from gateway.launcher.up.units import BuiltinUnits, LocalUnits, UnitsFailed

log = logging.getLogger("unitgate.up")
READY_TIMEOUT = 180.0  # first start on a small machine: every node imports torch at once
STOP_GRACE_S = 5.0  # a child replica's time past its drain before it is killed


@dataclass(frozen=True, slots=True)
class UpOptions:
    log_dir: Path | None = None  # node (or simulator) and replica logs (default: a new temp dir)
    replicas: int = 1  # gateway replicas; more than one share admin state through Redis
    simulated: bool = False  # simulated units instead of the builtin engine's
    config_path: Path | None = None  # what child replicas load themselves
    log_level: str = "info"  # the child replicas'
    log_format: str = "text"  # the child replicas' (text or json)


@dataclass(frozen=True, slots=True)
class Fleet:
    """The gateways of this run: replica 0 here, the others as children."""

    ports: tuple[ReplicaPorts, ...]
    redis_server: str | None  # the binary, when `up` runs the store for them
    # The folder of the vLLM units' KV event sockets (kv_events.py), from which child
    # replicas apply the events as replica 0 did; None when `up` does not turn them on.
    kv_dir: Path | None = None

    def store(self, config: Config, local: LocalRedis | None) -> str | None:
        """What the announcement says the replicas share their state through."""
        if local is not None:
            return f"redis-server at {local.url} (its data and log in {local.folder})"
        if len(self.ports) > 1 and config.admin.enabled:
            return f"the config's [state] store at {config.state.url}"
        return None


def run_up(config: Config, options: UpOptions = UpOptions()) -> int:
    """The command's body; returns the exit code (2 for a config it cannot run)."""
    refusal = _refusal(config, options)
    if refusal is not None:
        print(f"unitgate up: {refusal}", file=sys.stderr)
        return 2
    try:
        plan, fleet = _prepare(config, options)
    except (PlanError, VllmMissing) as exc:
        print(f"unitgate up: {exc}", file=sys.stderr)
        return 2
    generated = _ensure_admin_token(config)
    logs = options.log_dir or Path(tempfile.mkdtemp(prefix="unitgate-up-"))
    try:
        logs.mkdir(parents=True, exist_ok=True)  # --log-dir may name a folder to create
    except OSError as exc:
        print(f"unitgate up: --log-dir {logs}: {exc.strerror}", file=sys.stderr)
        return 2
    logs = logs.resolve()  # children run elsewhere (redis-server in its data folder)
    kv = None if options.simulated else _kv_folder(config, plan, logs)
    try:
        if kv is not None:
            config, plan = _with_kv(config, plan, kv.path)
            fleet = replace(fleet, kv_dir=kv.path)
        return _run_loop(config, plan, _Run(options, fleet, logs, generated))
    finally:
        if kv is not None:
            kv.remove()  # once every unit stopped: a temp folder of its own goes


def _prepare(config: Config, options: UpOptions) -> tuple[Plan, Fleet]:
    """The units and the gateways, checked before anything starts."""
    plan = _local_plan(config, options.simulated)
    if not options.simulated:
        _check_vllm_units(plan)
    binary = find_redis_server() if runs_store(config, options.replicas) else None
    ports = replica_ports(config, plan, options.replicas)
    if options.replicas > 1:
        check_free(config, ports)
    return plan, Fleet(ports, binary)


def _refusal(config: Config, options: UpOptions) -> str | None:
    """Why this run cannot start, found before anything starts; None when it can."""
    if options.replicas < 1:
        return f"--replicas must be an integer >= 1, got {options.replicas}"
    if options.replicas > 1 and options.config_path is None:
        return "--replicas needs the config's file: every replica loads it"
    if not options.simulated and importlib.util.find_spec("torch") is None:
        return (
            "the builtin engine needs the engine extra: "
            "pip install -e '.[engine]' -c constraints.txt (or run `unitgate up --simulated`)"
        )
    if config.gateway.worker_count > 1:
        beside = " (simulated units beside it: `unitgate sim --from-config FILE`)"
        return (
            f"[gateway].workers = {config.gateway.workers!r}: `up` runs the gateway "
            "inside its own process, so with one worker; `unitgate gateway` runs more"
            + (beside if options.simulated else "")
        )
    if runs_store(config, options.replicas) and find_redis_server() is None:
        return (
            f"--replicas {options.replicas} shares admin state through a local redis-server, "
            f'which is not on PATH: {INSTALL_HINT} (or set [state] backend = "redis" with '
            "the url of a Redis you run)"
        )
    return None


def _local_plan(config: Config, simulated: bool) -> Plan:
    if simulated:
        return _simulated_plan(config)
    plan = plan_units(config)
    if not plan.units:
        raise PlanError(
            'no unit of the config is of kind "unitgate" on loopback: nothing to start here'
        )
    for unit in plan.skipped:
        log.info(
            "unit %s: not on loopback or a stock server, not started here (the gateway still"
            " routes)",
            unit,
        )
    return plan


def _simulated_plan(config: Config) -> Plan:
    plan = plan_simulated(config)
    kinds = {u.id: u.kind for u in config.units}
    for unit in plan.units:
        if not unit.awaited:
            log.info(
                'unit %s: simulated, but the gateway probes it as kind "%s", which the simulator'
                " does not imitate: `ready` does not wait for it",
                unit.unit,
                kinds[unit.unit],
            )
    return plan


def _kv_folder(config: Config, plan: Plan, run: Path) -> SocketFolder | None:
    """The folder of the local units' KV event sockets, in the run's folder `run` (or a
    temp folder); None when `up` leaves the events off: no such unit, routing that does not
    read them (`prefix_scorer`), a gateway that cannot, or no folder short enough."""
    if not event_units(config, plan) or config.routing.prefix_scorer != "auto":
        return None
    missing = kv_missing()
    if missing:
        log.info(
            "units: KV cache events not turned on, so prefix routing is approximate: the "
            "gateway needs the kv extra (%s missing): pip install 'unitgate[kv]'",
            ", ".join(missing),
        )
        return None
    folder = socket_folder(run, [unit.id for unit in publishing_here(config, plan)])
    if folder is None:
        log.info(
            "units: KV cache events not turned on, so prefix routing is approximate: "
            "no folder only this user may enter, %s or a new temp folder, gives their Unix "
            "sockets a path of at most %d bytes (set TMPDIR to a short folder of yours)",
            run / "kv",
            SUN_PATH_MAX,
        )
    return folder


def _with_kv(config: Config, plan: Plan, folder: Path) -> tuple[Config, Plan]:
    """The config and plan the run goes on with: the vLLM units' KV events turned on, their
    sockets in `folder` (kv_events.py)."""
    config = with_kv_events(config, plan, folder)
    plan = plan_units(config)  # the units' engine_args now turn their events on
    for line in untokenized(config, plan):
        log.info("%s", line)
    return config, plan


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


@dataclass(frozen=True, slots=True)
class _Run:
    options: UpOptions
    fleet: Fleet
    log_dir: Path
    token: str | None  # generated for this run, to be printed

    def units(self, config: Config, plan: Plan) -> LocalUnits:
        env = node_env(os.environ, [config.admin.token_env])
        if self.options.simulated:  # the units as loaded: environment overrides applied
            return SimulatedUnits(config.units, self.log_dir, env)
        return BuiltinUnits(plan, Launcher(EngineOptions(), self.log_dir, env))

    def replicas(self, config: Config, store_url: str | None) -> list[ReplicaSupervisor]:
        if len(self.fleet.ports) == 1:
            return []
        assert self.options.config_path is not None  # _refusal said so
        launcher = ReplicaLauncher(
            self.options.config_path.resolve(),
            self.log_dir,
            {**os.environ, "PYTHONUNBUFFERED": "1"},  # the admin token included
            self.options.log_level,
            READY_TIMEOUT,
            store_url,
            self.options.log_format,
            self.options.simulated,
            self.fleet.kv_dir,
        )
        grace = config.gateway.shutdown_timeout + STOP_GRACE_S
        return [ReplicaSupervisor(p, launcher, Backoff(), grace) for p in self.fleet.ports[1:]]


def _run_loop(config: Config, plan: Plan, run: _Run) -> int:
    import uvloop

    raise_fd_limit()
    try:
        return uvloop.run(_up(config, plan, run))
    except ConfigError as exc:  # found at gateway start-up (admin token, state file)
        print(f"unitgate up: {exc}", file=sys.stderr)
        return 2
    except (StoreFailed, UnitsFailed) as exc:
        print(f"unitgate up: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # a listener's port is taken
        print(f"unitgate up: {exc}", file=sys.stderr)
        return 1


async def _up(config: Config, plan: Plan, run: _Run) -> int:
    """Start the store, the units, the gateways; at the stop, undo it in reverse: every
    gateway drains (at once), then the units stop, then the store."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with contextlib.AsyncExitStack() as stack:
        local = None
        if run.fleet.redis_server is not None:
            local = LocalRedis(run.fleet.redis_server, run.log_dir)
            stack.push_async_callback(_stopped, local.stop, "redis-server stopped")
            await local.start()
        units = run.units(config, plan)
        stack.push_async_callback(_stopped, units.stop, "every unit stopped")
        await units.start()
        if run.fleet.kv_dir is not None and not run.options.simulated:  # while units load
            env = node_env(os.environ, [config.admin.token_env])
            config = await export_tokenizers(config, plan, run.fleet.kv_dir, env)
        store_url = None if local is None else local.url
        children = run.replicas(config, store_url)
        tasks = [asyncio.create_task(c.run(), name=f"replica-{c.ports.index}") for c in children]
        stack.push_async_callback(_stop_replicas, children, tasks)
        own = config if not children else replica_config(config, run.fleet.ports[0], store_url)
        async with running(own) as gateway:
            code = await wait_fleet(gateway, children, plan, stop, READY_TIMEOUT, run.log_dir)
            if code == 0 and not stop.is_set():
                fleet = [_here(gateway), *[_where(c) for c in children]]
                what = describe_units(plan, run.options.simulated)
                announce(
                    config, fleet, what, run.log_dir, run.token, run.fleet.store(config, local)
                )
                await stop.wait()
            log.info("stopping: gateways drain for up to %g s", config.gateway.shutdown_timeout)
            for child in children:
                child.terminate()  # they drain alongside replica 0
            gateway.draining = True
    return code


def _here(gateway: Gateway) -> Where:
    return Where(0, gateway.public_url, gateway.metrics_url, os.getpid(), None)


def _where(replica: ReplicaSupervisor) -> Where:
    where = replica.first_ready.result()
    assert isinstance(where, Where)  # wait_fleet returned 0: every replica was ready
    return where


async def _stop_replicas(
    children: list[ReplicaSupervisor], tasks: list[asyncio.Task[None]]
) -> None:
    """Each returns once its process exited (SIGKILL after its grace); none restarts."""
    for child in children:
        child.terminate()
    for result in await asyncio.gather(*tasks, return_exceptions=True):
        if isinstance(result, Exception):
            log.error("replica supervisor failed: %r", result)
    if children:
        log.info("every gateway replica stopped")


async def _stopped(stop: Callable[[], Awaitable[None]], said: str) -> None:
    await stop()
    log.info(said)
