"""`unitgate worker --link-fd N`: one worker, started by the control plane (not by hand)."""

from __future__ import annotations

import argparse
import sys

from gateway.config import LOG_FORMATS
from gateway.observability.logformat import setup as setup_logging


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="unitgate worker", description=__doc__)
    p.add_argument("--link-fd", type=int, required=True, help="the control plane's socket")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.add_argument("--log-format", default="text", choices=LOG_FORMATS)
    ns = p.parse_args(argv)
    text = "%(asctime)s %(levelname)s %(name)s[worker]: %(message)s"
    setup_logging(ns.log_level, ns.log_format, text, "worker")
    import uvloop

    from gateway.base.oslimits import raise_fd_limit
    from gateway.workers.worker import run

    raise_fd_limit()
    return uvloop.run(run(ns.link_fd))


if __name__ == "__main__":
    sys.exit(main())
