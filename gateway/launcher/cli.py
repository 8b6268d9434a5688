"""`unitgate` command line: one entry point, subcommands resolved lazily.

Subcommands import their implementation only when chosen, so `unitgate gateway` does not pay
for (or require) the engine's or the load tester's dependencies.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from gateway.check_config import report as report_config_errors
from gateway.config import LOG_FORMATS, Config, ConfigError, load_config
from gateway.observability.logformat import setup as setup_logging
from gateway.version import version

# Subcommands implemented elsewhere, imported only when chosen: module holding their `main`.
_DELEGATED = {
    "sim": "loadtest.simunits.cli",
    "loadtest": "loadtest.gen.cli",
    "node": "engine.cli",
    "admin": "gateway.admin.cli",
    "worker": "gateway.workers.cli",  # started by the control plane, not by hand
    "replica": "gateway.launcher.up.replica",  # started by `unitgate up --replicas N`, not by hand
    "watch": "gateway.watch.cli",
    "check-config": "gateway.check_config",
}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] in _DELEGATED:  # owns its flags and needs no config file
        module = importlib.import_module(_DELEGATED[args[0]])
        code: int = module.main(args[1:])
        return code
    parser = _parser()
    ns = parser.parse_args(args)
    try:
        config = load_config(ns.config)
    except ConfigError as exc:
        report_config_errors(exc)  # every problem, one per line
        return 2
    log_format = ns.log_format or config.logging.format  # the flag wins over [logging]
    setup_logging(ns.log_level, log_format)
    if ns.command == "gateway":
        return _run_gateway(config, ns.ready_file)
    from gateway.launcher.up.main import UpOptions, run_up

    options = UpOptions(
        log_dir=ns.log_dir,
        replicas=ns.replicas,
        simulated=ns.simulated,
        config_path=Path(ns.config),
        log_level=ns.log_level,
        log_format=log_format,
    )
    return run_up(config, options)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="unitgate", description=__doc__)
    parser.add_argument("-V", "--version", action="version", version=f"unitgate {version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    gw = sub.add_parser("gateway", help="run the gateway")
    up = sub.add_parser("up", help="run a local cluster of units plus the gateway (the demo)")
    for p in (gw, up):
        p.add_argument(
            "--config", default="config.toml", help="TOML config (default: ./config.toml)"
        )
        p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
        p.add_argument(
            "--log-format",
            choices=LOG_FORMATS,
            help="text, or json: one JSON object per line (default: [logging] format, text)",
        )
    gw.add_argument(
        "--ready-file", type=Path, help="write bound addresses here as JSON once listening"
    )
    up.add_argument(
        "--simulated",
        action="store_true",
        help="serve simulated units (a test tool) instead of the builtin engine",
    )
    up.add_argument(
        "--log-dir",
        type=Path,
        help="node, simulator and replica logs (default: a new temp directory)",
    )
    up.add_argument(
        "--replicas",
        type=_replica_count,
        default=1,
        metavar="N",
        help="gateway replicas sharing admin state through a local redis-server (default 1)",
    )
    sub.add_parser("sim", help="simulated units for tests and load tests (see `unitgate sim -h`)")
    sub.add_parser("node", help="one node of a unit, builtin or vLLM (see `unitgate node -h`)")
    sub.add_parser("admin", help="the running gateway's admin API (see `unitgate admin -h`)")
    sub.add_parser("watch", help="/health for a process that serves none (see `unitgate watch -h`)")
    sub.add_parser(
        "check-config", help="validate a config and its UNITGATE__* overrides, list every error"
    )
    sub.add_parser(
        "loadtest", help="drive an OpenAI endpoint and report (see `unitgate loadtest -h`)"
    )
    return parser


def _replica_count(text: str) -> int:
    """argparse's check of --replicas: its message then names the flag, and the exit is 2."""
    try:
        count = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}") from None
    if count < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {count}")
    return count


def _run_gateway(config: Config, ready_file: Path | None) -> int:
    import uvloop

    from gateway.base.oslimits import raise_fd_limit

    if config.gateway.worker_count > 1:
        from gateway.workers.control import serve
    else:
        from gateway.server import serve

    raise_fd_limit()
    try:
        uvloop.run(serve(config, ready_file))
    except ConfigError as exc:  # found at start-up (admin token, state file): one line, no trace
        report_config_errors(exc)
        return 2
    return 0
