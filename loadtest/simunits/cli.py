"""`unitgate sim`: run simulated units (a test and load-test tool, never a serving path).

Prints one ready line and optionally writes a ready file so that a test harness can start
the simulator as a subprocess and learn its OS-assigned ports without racing it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from pathlib import Path

import uvloop

from gateway.base.oslimits import raise_fd_limit
from gateway.base.readyfile import write_ready
from loadtest.simunits.cluster import DEFAULT_MAX_TOKENS_CAP, DEFAULT_MODEL, SimCluster
from loadtest.simunits.state import Settings, ToolsMode
from loadtest.simunits.topology import (
    ConfigError,
    UnitSpec,
    generated_units,
    load_config,
    parse_served,
)

_DEFAULTS = Settings()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="unitgate sim",
        description="Simulated multi-node units for testing and load-testing the gateway.",
    )
    _add_topology_args(p)
    _add_control_args(p)
    _add_behaviour_args(p)
    return p


def _add_topology_args(p: argparse.ArgumentParser) -> None:
    topo = p.add_argument_group("topology")
    topo.add_argument(
        "--from-config",
        type=Path,
        metavar="PATH",
        help="simulate the [[units]] of this gateway TOML config, at its addresses",
    )
    topo.add_argument("--units", type=int, help="number of units (default 2)")
    topo.add_argument("--followers", type=int, help="follower nodes per unit (default 1)")
    topo.add_argument("--host", help="listen host for generated units (default 127.0.0.1)")
    topo.add_argument(
        "--nodes",
        metavar="UNIT:RANK,...",
        help="with --from-config: serve only these nodes (rank 0 brings the leader's API), "
        "so one node can run, and be killed or frozen, in a process of its own",
    )


def _add_control_args(p: argparse.ArgumentParser) -> None:
    ctl = p.add_argument_group("control and readiness")
    ctl.add_argument("--control-host", default="127.0.0.1")
    ctl.add_argument("--control-port", type=int, default=0, help="0 = OS-assigned")
    ctl.add_argument(
        "--ready-file",
        type=Path,
        metavar="PATH",
        help="write pid, control URL and node URLs here once listening",
    )


def _add_behaviour_args(p: argparse.ArgumentParser) -> None:
    beh = p.add_argument_group("behaviour defaults (per unit changeable via the control API)")
    beh.add_argument("--ttft-ms", type=float, default=_DEFAULTS.ttft_ms)
    beh.add_argument("--itl-ms", type=float, default=_DEFAULTS.itl_ms)
    beh.add_argument(
        "--tokens",
        type=int,
        default=_DEFAULTS.tokens,
        help="completion tokens when a request has no max_tokens",
    )
    beh.add_argument(
        "--tools",
        choices=[mode.value for mode in ToolsMode],
        default=_DEFAULTS.tools.value,
        help="answer to a request with tools: a tool call, plain text, or a call whose "
        "arguments are not JSON (a revision that broke tool calling)",
    )
    beh.add_argument(
        "--variant",
        default=_DEFAULTS.variant,
        help="change the answers' words, deterministically (units of one variant agree)",
    )
    beh.add_argument(
        "--stall-rate",
        type=float,
        default=_DEFAULTS.stall_rate,
        help="the share of requests whose first token comes --stall-ms late (stragglers)",
    )
    beh.add_argument("--stall-ms", type=float, default=_DEFAULTS.stall_ms)
    beh.add_argument("--max-tokens-cap", type=int, default=DEFAULT_MAX_TOKENS_CAP)
    beh.add_argument("--model", default=DEFAULT_MODEL, help="model id served by /v1/models")


def _specs(p: argparse.ArgumentParser, args: argparse.Namespace) -> list[UnitSpec]:
    if args.from_config is not None:
        if any(v is not None for v in (args.units, args.followers, args.host)):
            p.error("--from-config cannot be combined with --units, --followers or --host")
        try:
            return load_config(args.from_config)
        except ConfigError as exc:
            p.error(str(exc))
    units = 2 if args.units is None else args.units
    followers = 1 if args.followers is None else args.followers
    if units < 1 or followers < 0:
        p.error("--units must be >= 1 and --followers >= 0")
    return generated_units(units, followers, args.host or "127.0.0.1")


def _served(
    p: argparse.ArgumentParser, args: argparse.Namespace, specs: list[UnitSpec]
) -> frozenset[tuple[str, int]] | None:
    if args.nodes is None:
        return None
    if args.from_config is None:
        p.error("--nodes needs --from-config: other processes must agree on the addresses")
    try:
        return parse_served(args.nodes, specs)
    except ConfigError as exc:
        p.error(str(exc))


def _check_behaviour(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.ttft_ms < 0 or args.itl_ms < 0 or args.stall_ms < 0:
        p.error("--ttft-ms, --itl-ms and --stall-ms must be >= 0")
    if not 0 <= args.stall_rate <= 1:
        p.error("--stall-rate must be a share in [0, 1]")
    if args.tokens < 1 or args.max_tokens_cap < 1:
        p.error("--tokens and --max-tokens-cap must be >= 1")


def behaviour_settings(args: argparse.Namespace) -> Settings:
    """Every unit's settings at start, from the behaviour flags (checked before)."""
    tools = ToolsMode(args.tools)
    return Settings(
        args.ttft_ms,
        args.itl_ms,
        args.tokens,
        tools,
        args.variant,
        args.stall_rate,
        args.stall_ms,
    )


def _announce(cluster: SimCluster, ready_file: Path | None) -> None:
    """Runs in a worker thread: file and stdout writes can block."""
    if ready_file is not None:
        write_ready(ready_file, {"pid": os.getpid(), **cluster.describe()})
    print(f"unitgate-sim ready {cluster.control_url}", flush=True)


async def _run(cluster: SimCluster, ready_file: Path | None) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        async with cluster:
            await asyncio.to_thread(_announce, cluster, ready_file)
            await stop.wait()
    except OSError as exc:
        print(f"unitgate-sim: {exc}", file=sys.stderr)
        return 1
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    specs = _specs(parser, args)
    served = _served(parser, args, specs)
    _check_behaviour(parser, args)
    raise_fd_limit()
    cluster = SimCluster(
        specs=specs,
        settings=behaviour_settings(args),
        model=args.model,
        max_tokens_cap=args.max_tokens_cap,
        control_host=args.control_host,
        control_port=args.control_port,
        serve=served,
    )
    return uvloop.run(_run(cluster, args.ready_file))
