"""One "replica" of the limits tests in a process of its own: a Limiter on the shared Redis,
flushing in the background, sending its part of the requests on a clock `speed` times faster
than real time (the minute is shared by wall clock, so the processes agree on it).

python -m tests.gateway.limits.limits_replica SOCKET NAME START SPEED REQUESTS OFFSET STRIDE
prints {"admitted": n, "store_calls": n, "degraded": bool} on its last line.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

import redis.asyncio as aioredis

from gateway.config.limits import LimitsConfig
from gateway.limits.decisions import Grant, KeyLimits
from gateway.limits.limiter import Limiter
from gateway.limits.redis_store import RedisStore

T0 = 1_000_000.0
GAP_S = 0.2  # simulated seconds between two requests of the fleet
LIMITS = KeyLimits(rpm=120, tpm=1_000_000, max_inflight=50)


async def run(
    socket: str, name: str, start: float, speed: float, requests: int, offset: int, stride: int
) -> dict[str, object]:
    def clock() -> float:
        return T0 + (time.time() - start) * speed

    # 2 s: a loaded CI machine (and a Redis that fsyncs every write) can stall a call for
    # half a second, and a timeout is a (correct) switch to the local shares.
    client = aioredis.Redis(unix_socket_path=socket, socket_timeout=2.0, socket_connect_timeout=2.0)
    store = RedisStore(client, "test", name, ttl=3.0, timeout=2.0)
    config = LimitsConfig(flush_interval=0.25 / speed, slots_ttl=3.0)
    limiter = Limiter(store, config, live_replicas=lambda: stride, clock=clock)
    limiter.start()
    admitted, degraded = 0, False
    for i in range(requests):
        at = start + (i * stride + offset) * GAP_S / speed
        await asyncio.sleep(max(0.0, at - time.time()))
        answer = await limiter.admit("k", LIMITS, 100, clock())
        degraded |= limiter.degraded
        if isinstance(answer, Grant):
            admitted += 1
            limiter.settle(answer, 100)
    await asyncio.sleep(1.0)  # a few flushes: a replica that was degraded finds the store back
    degraded_at_end = limiter.degraded
    await limiter.close()
    return {
        "admitted": admitted,
        "store_calls": store.ops,
        "degraded": degraded,
        "degraded_at_end": degraded_at_end,
    }


if __name__ == "__main__":
    socket, name, start, speed, requests, offset, stride = sys.argv[1:8]
    result = asyncio.run(
        run(socket, name, float(start), float(speed), int(requests), int(offset), int(stride))
    )
    print(json.dumps(result))
