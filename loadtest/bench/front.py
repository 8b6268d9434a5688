"""`python -m loadtest.bench.front`: what aiohttp's server costs per streamed request, against
a bare asyncio Protocol on httptools' parser.

The gateway's public listener is aiohttp. Replacing it with a Protocol of its own is a large
change, so this measures the most it could save before anyone makes it. The two servers of
`loadtest.bench.front_servers` answer the same streamed request the same way and do nothing
else. Each is pinned to a core of its own; the load runs in this process, pinned to the other
core: `--concurrency` keep-alive connections, each sending `--requests` requests one after
another. Rounds alternate between the two servers. Each round prints the server's CPU per
request, read from /proc, and its request rate; the summary gives the medians and their ratio.

    python -m loadtest.bench.front --rounds 3 --concurrency 32 --requests 300
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

import uvloop

from loadtest.bench.front_servers import LAST_CHUNK, PATH
from loadtest.bench.processes import CLK_TCK, child, cpu_ticks, pin_cpus, pinned

KINDS = ("aiohttp", "protocol")
BODY = b'{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}'
REQUEST = (
    b"POST " + PATH.encode() + b" HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
    b"Accept: */*\r\nUser-Agent: loadtest.bench.front\r\nContent-Length: %d\r\n\r\n%s"
) % (len(BODY), BODY)
WARM_UP = 20  # requests per connection before each measured round
ROUND_TIMEOUT_S = 120.0


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m loadtest.bench.front", description=__doc__)
    p.add_argument("--rounds", type=int, default=3, help="measured rounds per server")
    p.add_argument("--concurrency", type=int, default=32, help="keep-alive connections")
    p.add_argument("--requests", type=int, default=300, help="requests per connection")
    args = p.parse_args(argv)
    for name in ("rounds", "concurrency", "requests"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1, not {getattr(args, name)}")
    return args


async def _connection(host: str, port: int, n: int) -> None:
    """`n` requests on one connection, each answer read to its last chunk."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        for _ in range(n):
            writer.write(REQUEST)
            answer = b""
            while not answer.endswith(LAST_CHUNK):
                data = await reader.read(65536)
                if not data:
                    raise SystemExit("the server closed a connection mid-answer")
                answer += data
            if not answer.startswith(b"HTTP/1.1 200 "):
                raise SystemExit(f"the server answered {answer[:40]!r}")
    finally:
        writer.close()


async def _load(url: str, connections: int, n: int) -> None:
    parts = urlsplit(url)
    assert parts.hostname is not None and parts.port is not None
    work = (_connection(parts.hostname, parts.port, n) for _ in range(connections))
    async with asyncio.timeout(ROUND_TIMEOUT_S):
        await asyncio.gather(*work)


def _round(kind: str, args: argparse.Namespace, tmp: Path, cpu: int | None) -> tuple[float, float]:
    """CPU us per request of the `kind` server (pinned to `cpu`), and its requests per second."""
    ready = tmp / f"{kind}.json"
    ready.unlink(missing_ok=True)
    with child(["loadtest.bench.front_servers", kind, str(ready)], ready, cpu, kind) as info:
        uvloop.run(_load(info["url"], args.concurrency, WARM_UP))
        before, start = cpu_ticks(info["pid"]), time.perf_counter()
        uvloop.run(_load(info["url"], args.concurrency, args.requests))
        took, ticks = time.perf_counter() - start, cpu_ticks(info["pid"]) - before
    total = args.concurrency * args.requests
    return ticks * 1e6 / CLK_TCK / total, total / took


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    pins = pin_cpus()
    cpu: dict[str, list[float]] = {kind: [] for kind in KINDS}
    rate: dict[str, list[float]] = {kind: [] for kind in KINDS}
    with (
        tempfile.TemporaryDirectory(prefix="bench-front-") as tmp_dir,
        pinned(None if pins is None else pins.load),
    ):
        for n in range(args.rounds):
            for kind in KINDS if n % 2 == 0 else KINDS[::-1]:
                us, per_s = _round(kind, args, Path(tmp_dir), None if pins is None else pins.relay)
                cpu[kind].append(us)
                rate[kind].append(per_s)
                print(f"round {n + 1} {kind:8}: {us:6.1f} us CPU per request, {per_s:,.0f} req/s")
    a, p = (statistics.median(cpu[kind]) for kind in KINDS)
    print(f"\n| server | CPU us per request (median of {args.rounds}) | req/s (median) |")
    print("|---|---:|---:|")
    for kind in KINDS:
        us, per_s = statistics.median(cpu[kind]), statistics.median(rate[kind])
        print(f"| {kind} | {us:.1f} | {per_s:,.0f} |")
    print(f"\naiohttp costs {a - p:.1f} us per request more ({a / max(p, 1e-9):.2f}x the Protocol)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
