"""`unitgate watch`: answer a node's `/health` for one process that serves no HTTP itself.

  unitgate watch (--pid N | --pidfile PATH | --match REGEX)
                 (--unit ID --rank R | --from-env lws [--unit ID])
                 [--host H] [--port P]

Prints `health_port=N` once listening (port 0 picks a free one). Exit codes: 0 stopped by
SIGTERM or SIGINT, 1 could not listen, 2 bad usage (the message names the flag).
"""

from __future__ import annotations

import argparse
import logging
import os
import re
from pathlib import Path

from gateway.base import lws
from gateway.watch.locate import CmdlineMatch, FixedPid, Locator, PidFile, Tracker, read_stat
from gateway.watch.placement import Identity, identify

PROG = "unitgate watch"


def main(argv: list[str]) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    try:
        identity = identify(ns.unit, ns.rank, ns.from_env, os.environ)
        locator = _locator(ns)
    except ValueError as exc:
        parser.error(str(exc))  # exits 2
    logging.basicConfig(
        level=ns.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    tracker = Tracker(locator)
    tracker.look()  # logs what it watches (or that it found nothing yet) before any probe
    return _run(identity, tracker, ns.host, ns.port)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--pid", type=_positive, help="this process (once gone, it stays gone)")
    which.add_argument(
        "--pidfile", type=Path, help="the pid in this file, reread whenever the process is gone"
    )
    which.add_argument(
        "--match",
        metavar="REGEX",
        help="the oldest process whose command line (arguments joined by spaces) matches, "
        "searched again whenever it is gone",
    )
    p.add_argument("--unit", help="the unit id (with --from-env lws: the leader pod's name)")
    p.add_argument("--rank", type=int, help="the node's rank (0 is the leader)")
    p.add_argument(
        "--from-env",
        choices=lws.SOURCES,
        help=f"lws: --rank from {lws.WORKER_INDEX}, --unit from {lws.LEADER_ADDRESS}",
    )
    p.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1)")
    p.add_argument("--port", type=_port, default=0, help="listen port (default 0: a free one)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return p


def _locator(ns: argparse.Namespace) -> Locator:
    if ns.pid is not None:
        if read_stat(ns.pid) is None:
            raise ValueError(f"--pid {ns.pid}: no such process")
        return FixedPid(ns.pid)
    if ns.pidfile is not None:
        return PidFile(ns.pidfile)
    if not ns.match:
        raise ValueError("--match: must not be empty (it would match every process)")
    try:
        pattern = re.compile(ns.match)
    except re.error as exc:
        raise ValueError(f"--match: not a regular expression ({exc}): {ns.match!r}") from None
    return CmdlineMatch(pattern)


def _run(identity: Identity, tracker: Tracker, host: str, port: int) -> int:
    import uvloop

    from gateway.watch.app import health_app, serve

    code: int = uvloop.run(serve(health_app(identity, tracker), host, port))
    return code


def _positive(text: str) -> int:
    """argparse's check of --pid: its message then names the flag, and the exit is 2."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be a process id (an integer >= 1), got {text!r}"
        ) from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a process id (an integer >= 1), got {value}")
    return value


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be 0..65535, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be 0..65535, got {value}")
    return value
