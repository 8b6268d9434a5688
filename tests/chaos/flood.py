"""`python -m tests.chaos.flood URL HEADERS_JSON RATE DURATION LABEL`: an open loop in a process
of its own (tests/chaos/openloop.py), its results' statuses and completions as one JSON line.

The noisy-neighbour scenario measures one tenant's time to first token while another floods:
were both loops in one process, the flood's hundreds of requests would delay the measured
tenant's reads in the client itself and be counted as the gateway's latency.
"""

from __future__ import annotations

import asyncio
import sys
from collections import Counter

import orjson

from tests.chaos.openloop import open_loop


def main(argv: list[str]) -> None:
    url, headers, rate, duration, label = argv
    head: dict[str, str] = orjson.loads(headers)
    results = asyncio.run(open_loop(url, float(rate), float(duration), lambda _: (label, head)))
    statuses = Counter(str(r.status) for r in results)
    print(
        orjson.dumps(
            {
                "sent": len(results),
                "statuses": statuses,
                "completed": sum(r.completed for r in results),
            }
        ).decode(),
        flush=True,
    )


if __name__ == "__main__":
    main(sys.argv[1:])
