"""`python -m loadtest.bench.limits`: the limits engine's CPU per request and store calls.

In process, on a simulated clock (10,000 requests/s over 100 keys, each request admitted,
its headers written and settled, a flush every 0.25 s): CPU microseconds per request with
no limits, with rpm only, and with rpm + tpm + max_inflight, on the in-memory store; with
`--redis-socket`, the same against a running redis-server (its calls are round trips, so
CPU there includes the client's work) and the store calls per request. The gateway's own
benchmark (`make bench`) measures the whole request path; this isolates the limiter.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Sequence

from gateway.limits.decisions import Grant, KeyLimits
from gateway.limits.limiter import Limiter
from gateway.limits.memory import MemoryStore
from gateway.limits.store import Store

CASES = {
    "off": KeyLimits(),
    "rpm": KeyLimits(rpm=10**7),
    "rpm+tpm+inflight": KeyLimits(rpm=10**7, tpm=10**9, max_inflight=10**5),
}
RATE = 10_000.0  # simulated requests per second
KEYS = 100


async def _run(store: Store, limits: KeyLimits, requests: int) -> tuple[float, int]:
    """(CPU microseconds per request, store calls made)."""
    limiter = Limiter(store)
    now, flushed = 1_000_000.0, 1_000_000.0
    started = time.process_time()
    for i in range(requests):
        now += 1 / RATE
        answer = await limiter.admit(f"k{i % KEYS}", limits, 300, now)
        answer.headers()
        if isinstance(answer, Grant):
            limiter.settle(answer, 280)
        if now - flushed >= 0.25:
            flushed = now
            await limiter.flush(now)
    spent = time.process_time() - started
    return spent / requests * 1e6, limiter.takes + limiter.pushes


async def _bench(requests: int, redis_socket: str | None) -> None:
    print(f"{requests} requests at {RATE:g}/s over {KEYS} keys; us per request, store calls")
    for case, limits in CASES.items():
        cpu, calls = await _run(MemoryStore(), limits, requests)
        print(f"  memory  {case:<17} {cpu:7.2f} us  {calls / requests:.4f} calls/request")
    if redis_socket:
        import redis.asyncio as aioredis

        from gateway.limits.redis_store import RedisStore

        for case, limits in CASES.items():
            client = aioredis.Redis(unix_socket_path=redis_socket)
            store = RedisStore(client, "bench", "r0", ttl=3.0, timeout=1.0)
            cpu, calls = await _run(store, limits, requests)
            await store.close()
            print(f"  redis   {case:<17} {cpu:7.2f} us  {calls / requests:.4f} calls/request")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.bench.limits", description=__doc__)
    p.add_argument("--requests", type=int, default=200_000)
    p.add_argument("--redis-socket", help="a redis-server's Unix socket (data is written)")
    args = p.parse_args(argv)
    asyncio.run(_bench(args.requests, args.redis_socket))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
