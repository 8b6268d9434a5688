"""`python -m engine.backends.builtin.bare --role leader|follower ...`: a node without the
OpenAI server, for tests and smoke runs of the runtime alone.

A bare leader is the engine plus /health (on a free port unless --health-port says): what a
test needs to watch STOP reach the followers or a lost leader end them, without an API port
to pick. A bare follower is exactly `unitgate node`'s.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
from collections.abc import Sequence

from engine.backends.builtin.node import run_follower_node, start_leader
from engine.flags import parse
from engine.runtime.health import serve_health, stop_health
from engine.settings import NodeSettings


def serve_bare_leader(settings: NodeSettings) -> int:
    """Engine plus /health until SIGTERM or SIGINT, then STOP the followers."""
    engine = start_leader(settings)
    server = serve_health(engine.health, settings.health_host, settings.listener_port)
    print(f"health_port={server.server_port}", flush=True)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    stop_health(server)
    engine.shutdown()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    settings = parse(argv, prog="python -m engine.backends.builtin.bare")
    if settings.is_leader:
        return serve_bare_leader(settings)
    return run_follower_node(settings)


if __name__ == "__main__":
    sys.exit(main())
