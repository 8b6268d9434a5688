"""`python -m loadtest.bench.hedge`: what hedging does to the tail of time to first token.

Four simulated units, `--stall-units` of them stragglers: `--stall-rate` of their requests
wait `--stall-ms` before their first token. (With one straggler, the gateway's load balancing
sends it fewer requests while its stalled ones are in flight, so the share of all requests
that waited out a stall is measured, and printed.) Two
gateways of this tree over them, one without hedging and one with `[hedge] enabled` (its
defaults: twice the predicted time to first token, at most 5% more prefill tokens), each run
in turn at two loads: a share of the fleet's slots (`[admission] unit_max_inflight` per unit)
kept busy by closed-loop clients, 60% (the hedge's case) and 120% (overload: requests queue,
and the hedges must hold back). Every request is a streamed chat; its time to first token is
measured by the client, to the first event. It prints, per load and gateway: requests,
failures, the requests that waited out a stall (first token after half of `--stall-ms`), TTFT
p50, p99, p99.9, the hedges fired and won, and the extra prefill (the prompts are alike, so
the second copies' share of all prefill tokens is their share of requests), as a markdown
table for docs/benchmarks.md.

    python -m loadtest.bench.hedge --requests 10000
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import uvloop

from loadtest.bench.processes import MODEL, child, gateway_toml

SIDES = ("off", "hedged")
LOADS = (0.6, 1.2)
CAP = 8  # slots per unit


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m loadtest.bench.hedge",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--requests", type=int, default=10_000, help="per gateway at 60%% load")
    p.add_argument("--overload-requests", type=int, default=3_000, help="per gateway at 120%%")
    p.add_argument("--stall-units", type=int, default=1, help="stragglers, of the four units")
    p.add_argument("--stall-rate", type=float, default=0.08, help="of a straggler's requests")
    p.add_argument("--stall-ms", type=float, default=2000.0)
    p.add_argument("--ttft-ms", type=float, default=30.0)
    p.add_argument("--itl-ms", type=float, default=5.0)
    p.add_argument("--tokens", type=int, default=8)
    args = p.parse_args(argv)
    if args.requests < 100 or args.overload_requests < 100:
        p.error("--requests and --overload-requests must be at least 100")
    if not 0 <= args.stall_rate <= 1:
        p.error("--stall-rate must be a share in [0, 1]")
    if not 1 <= args.stall_units <= 4:
        p.error("--stall-units must be 1..4")
    return args


def config(units: list[dict[str, Any]], hedged: bool) -> str:
    toml = gateway_toml(units, cap=CAP, queue=4096)
    if hedged:
        toml = toml.replace("[upstream]", "[hedge]\nenabled = true\n[upstream]", 1)
    return toml


async def client(
    http: aiohttp.ClientSession, url: str, todo: list[int], ttfts: list[float], failed: list[str]
) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    while todo:
        todo.pop()
        began = time.monotonic()
        try:
            async with http.post(url + "/v1/chat/completions", json=body) as resp:
                first = await resp.content.readline()
                ttft = time.monotonic() - began
                rest = await resp.read()
            if resp.status != 200 or not first.startswith(b"data:") or b"[DONE]" not in rest:
                failed.append(f"{resp.status} {first[:80]!r}")
            else:
                ttfts.append(ttft)
        except (aiohttp.ClientError, TimeoutError) as exc:
            failed.append(repr(exc))


async def measure(
    url: str, metrics: str, requests: int, concurrency: int, stall_s: float
) -> dict[str, Any]:
    ttfts: list[float] = []
    failed: list[str] = []
    todo = list(range(requests))
    timeout = aiohttp.ClientTimeout(total=60)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as http:
        before = await scrape(http, metrics)
        began = time.monotonic()
        await asyncio.gather(*(client(http, url, todo, ttfts, failed) for _ in range(concurrency)))
        seconds = time.monotonic() - began
        after = await scrape(http, metrics)
    delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    ttfts.sort()
    return {
        "requests": requests,
        "failed": len(failed),
        "p50": _quantile(ttfts, 0.5),
        "p99": _quantile(ttfts, 0.99),
        "p999": _quantile(ttfts, 0.999),
        "rate": requests / seconds,
        "stalled": sum(1 for t in ttfts if t > stall_s / 2),
        "fired": delta.get("fired", 0.0),
        "won": delta.get("second", 0.0),
        "extra": delta.get("fired", 0.0) / requests,
    }


async def scrape(http: aiohttp.ClientSession, metrics: str) -> dict[str, float]:
    """The hedges fired and won by the second copy, summed over their labels."""
    async with http.get(metrics + "/metrics") as resp:
        text = await resp.text()
    found: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("unitgate_hedges_total{"):
            for outcome in ("fired", "second"):
                if f'outcome="{outcome}"' in line:
                    found[outcome] = found.get(outcome, 0.0) + float(line.rsplit(" ", 1)[1])
    return found


def _quantile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return math.nan
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    with (
        tempfile.TemporaryDirectory(prefix="unitgate-hedge-") as tmp_name,
        contextlib.ExitStack() as stack,
    ):
        tmp = Path(tmp_name)
        sim_argv = ["loadtest.simunits", "--units", "4", "--followers", "0", "--model", MODEL]
        sim_argv += ["--ttft-ms", f"{args.ttft_ms:g}", "--itl-ms", f"{args.itl_ms:g}"]
        sim_argv += ["--tokens", str(args.tokens), "--ready-file", str(tmp / "sim.json")]
        sim = stack.enter_context(child(sim_argv, tmp / "sim.json", None, "sim"))
        units = sim["units"]
        for unit in units[: args.stall_units]:
            _settings(sim["control"], unit["id"], args.stall_rate, args.stall_ms)
        gateways = {}
        for side in SIDES:
            (tmp / f"{side}.toml").write_text(config(units, side == "hedged"))
            ready = tmp / f"{side}.json"
            argv = ["gateway", "gateway", "--config", str(tmp / f"{side}.toml")]
            argv += ["--log-level", "warning", "--ready-file", str(ready)]
            gateways[side] = stack.enter_context(child(argv, ready, None, f"{side} gateway", True))
        rows = []
        for load in LOADS:
            concurrency = max(1, round(load * CAP * len(units)))
            requests = args.requests if load < 1 else args.overload_requests
            for side in SIDES:
                info = gateways[side]
                found = uvloop.run(
                    measure(
                        info["public"], info["metrics"], requests, concurrency, args.stall_ms / 1e3
                    )
                )
                rows.append((load, side, found))
                print(f"{load:.0%} {side}: {found}", flush=True)
    print(
        f"\n{args.stall_rate:.0%} of the requests of {args.stall_units} unit(s) of four stall"
        f" {args.stall_ms:g} ms before their first token; first token otherwise"
        f" {args.ttft_ms:g} ms\n"
    )
    print("| load | gateway | requests | failed | waited out a stall | TTFT p50 ms | p99 ms |"
          " p99.9 ms | req/s | hedges fired | won by the 2nd copy | extra prefill |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for load, side, f in rows:
        print(
            f"| {load:.0%} | {side} | {f['requests']:,} | {f['failed']} |"
            f" {f['stalled'] / f['requests']:.2%} | {f['p50'] * 1e3:.0f} |"
            f" {f['p99'] * 1e3:.0f} | {f['p999'] * 1e3:.0f} | {f['rate']:.0f} |"
            f" {f['fired']:.0f} | {f['won']:.0f} | {f['extra']:.1%} |"
        )
    for load in LOADS:
        off, on = (f for lo, _, f in rows if lo == load)
        ratios = [on[k] / off[k] for k in ("p99", "p999", "p50")]
        print(
            "\nat {:.0%}: p99 {:.2f}x, p99.9 {:.2f}x, p50 {:.2f}x with hedging".format(
                load, *ratios
            )
        )
    return 0


def _settings(control: str, unit: str, rate: float, stall_ms: float) -> None:
    async def post() -> None:
        async with (
            aiohttp.ClientSession() as http,
            http.post(
                f"{control}/units/{unit}/settings",
                json={"stall_rate": rate, "stall_ms": stall_ms},
            ) as resp,
        ):
            resp.raise_for_status()

    uvloop.run(post())


if __name__ == "__main__":
    sys.exit(main())
