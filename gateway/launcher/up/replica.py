"""`unitgate replica`: gateway replica i of `unitgate up --replicas N`, in a process of its own.

Started by `up` (replicas.py), not by hand. It loads the same config file as `up`, applies
the vLLM units' KV events as `up` did (kv_events.py, their sockets in the folder `up` made,
`--kv-dir`) and fleet.py's `replica_config` for its index (its ports, the shared store), and
hosts the gateway as `up` hosts replica 0. It writes its ready file only once it routes to
every local unit on its own probers' verdict, the same test `up` applies to replica 0
(ready.py), so `up` says `ready` only when every replica would serve. SIGTERM drains it like
any gateway.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from pathlib import Path

from gateway.api import (
    LOG_FORMATS,
    Config,
    ConfigError,
    load_config,
    raise_fd_limit,
    running,
    setup_logging,
)
from gateway.base.readyfile import write_ready
from gateway.launcher.up.fleet import ReplicaPorts, replica_config
from gateway.launcher.up.kv_events import with_kv_events
from gateway.launcher.up.plan import Plan, PlanError, plan_simulated, plan_units
from gateway.launcher.up.ready import wait_routable

log = logging.getLogger("unitgate.up")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="unitgate replica", description=__doc__)
    p.add_argument("--config", type=Path, required=True, help="the config file `up` runs")
    p.add_argument("--index", type=int, required=True, help="this replica's number, 1..N-1")
    p.add_argument("--port", type=int, required=True, help="the public API's port")
    p.add_argument("--metrics-port", type=int, required=True, help="the operator listener's")
    p.add_argument("--store-url", help="the redis-server `up` runs (default: the config's)")
    p.add_argument(
        "--simulated", action="store_true", help="`up --simulated`: the units are simulated"
    )
    p.add_argument(
        "--kv-dir",
        type=Path,
        help="the folder of the vLLM units' KV event sockets: the events read as replica 0 does",
    )
    p.add_argument("--ready-file", type=Path, required=True, help="written once ready")
    p.add_argument("--ready-within", type=float, default=180.0, help="seconds")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.add_argument("--log-format", default="text", choices=LOG_FORMATS)
    return p


def main(argv: list[str]) -> int:
    ns = _parser().parse_args(argv)
    text = f"%(asctime)s %(levelname)s %(name)s [replica {ns.index}]: %(message)s"
    setup_logging(ns.log_level, ns.log_format, text, f"replica {ns.index}")
    try:
        file_config = load_config(ns.config)
        if ns.kv_dir is not None:
            file_config = with_kv_events(file_config, plan_units(file_config), ns.kv_dir)
        plan = plan_simulated(file_config) if ns.simulated else plan_units(file_config)
        ports = ReplicaPorts(ns.index, ns.port, ns.metrics_port)
        config = replica_config(file_config, ports, ns.store_url)
    except (ConfigError, PlanError) as exc:
        print(f"unitgate replica {ns.index}: {exc}", file=sys.stderr)
        return 2
    import uvloop

    raise_fd_limit()
    try:
        return uvloop.run(_serve(config, plan, ns.index, ns.ready_file, ns.ready_within))
    except ConfigError as exc:  # found at gateway start-up (admin token, state store)
        print(f"unitgate replica {ns.index}: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a listener's port is taken
        print(f"unitgate replica {ns.index}: {exc}", file=sys.stderr)
        return 1


async def _serve(config: Config, plan: Plan, index: int, ready_file: Path, within: float) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with running(config) as gateway:
        code = await wait_routable(gateway, plan, stop, within, ready_file.parent)
        if code == 0 and not stop.is_set():
            info = {
                "pid": os.getpid(),
                "public": gateway.public_url,
                "metrics": gateway.metrics_url,
            }
            await asyncio.to_thread(write_ready, ready_file, info)
            log.info("replica %d routes to every local unit: ready", index)
        await stop.wait()
        log.info("stopping: draining for up to %g s", config.gateway.shutdown_timeout)
        gateway.draining = True
    log.info("replica %d stopped", index)
    return 0
