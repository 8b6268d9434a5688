"""`unitgate node`: one node of a unit, as its own process (`--backend builtin` or `vllm`).

The leader is rank 0 plus the OpenAI server, which also answers /health; given --health-port
it answers /health there too, from a thread that does not queue behind the API's streams (the
gateway then probes that port). A follower mirrors the leader's steps and answers /health on
its own port. `unitgate up` starts these locally; on real hosts an operator (or a
LeaderWorkerSet, with `--from-env lws`: see gateway/base/lws.py) starts one per host.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

from engine.backends.registry import BackendUnavailable, lookup
from engine.flags import parse


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        settings = parse(argv, description=__doc__)
        return lookup(settings.backend)(settings)
    except (ValueError, BackendUnavailable) as exc:
        print(f"unitgate node: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # e.g. the API port is taken
        print(f"unitgate node: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
