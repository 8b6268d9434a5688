"""`python -m loadtest.bench.hedge_cost`: what a hedge costs stock vLLM units, by their own count.

Two stock `vllm serve` processes (the SmolLM2 export, one core each) and two gateways of this
tree in front of them, used in turn with the same kind of requests, one at a time: hedging
off, and hedging on with a delay shorter than a request's prefill (`min_delay = max_delay =
--delay`), so that every request is hedged while its first copy computes its prompt. A request
is a streamed chat of about `--prompt` tokens (its own first line: no prefix is cached) and 8
output tokens. Per gateway, from the servers before and after: the prompt tokens they computed
(`vllm:prefix_cache_queries_total` less `..._hits_total`: counted when a request is
scheduled, so an aborted copy's too; vLLM's prompt token counters count finished requests
only), the requests they aborted (their logs' "Aborted request" lines, with
`--enable-log-requests`: vLLM counts a client's abort in no metric), the requests still
running or waiting after the run, and their CPU seconds (their process groups, from /proc);
from the gateway: the hedges fired and won, and the prefill tokens it counted wasted.
Reported: per hedge, the prompt tokens and CPU the servers spent beyond the unhedged run, and
the aborts vLLM logged against the hedges.

    python -m loadtest.bench.hedge_cost [--requests 20] [--prompt 1000] [--delay 0.2]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp

from engine.backends.vllm.env import clean_shm
from loadtest.bench.prefix.fleet import fetch
from loadtest.bench.prefix.scrape import total
from loadtest.bench.processes import CLK_TCK, child, tree_ticks
from loadtest.bench.stock_vllm import SERVED, Server, export_smollm2, launch, wait_ready

# Counted when a request is scheduled (an aborted copy's too), unlike vLLM's prompt token
# counters, which count finished requests only.
QUERIES, HITS = "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"
ABORTED = "Aborted request"  # vLLM's log line for a request its client closed (log_requests)
FILLER = "The shop sells running shoes, trail shoes and walking boots in many sizes. "
VENV_VLLM = Path(__file__).resolve().parents[2] / ".venv-vllm" / "bin" / "python"


def gateway_toml(servers: Sequence[Server], delay: float | None) -> str:
    hedge = (
        "[hedge]\nenabled = false\n"
        if delay is None
        else f"[hedge]\nenabled = true\nmin_delay = {delay}\nmax_delay = {delay}\n"
        "budget_share = 1.0\n"
    )
    head = (
        f'[gateway]\nport = 0\nmodels = ["{SERVED}"]\n[metrics]\nport = 0\n'
        '[admin]\nenabled = false\n[routing]\naffinity = "none"\nlatency_model = "off"\n'
        f"[timeouts]\nfirst_byte = 120.0\n{hedge}"
    )
    units = "".join(
        f'[[units]]\nid = "v{i}"\nleader = "{s.url}"\nkind = "vllm"\nserved_model = "{SERVED}"\n'
        for i, s in enumerate(servers)
    )
    return head + units


def servers_now(servers: Sequence[Server]) -> dict[str, float]:
    """The servers' computed prompt tokens, aborted requests (their logs' count), requests
    still running or waiting, and CPU seconds, summed."""
    found = {"computed": 0.0, "aborted": 0.0, "busy": 0.0, "cpu": 0.0}
    for server in servers:
        text = fetch(server.url + "/metrics")
        found["computed"] += total(text, QUERIES) - total(text, HITS)
        found["busy"] += total(text, "vllm:num_requests_running")
        found["busy"] += total(text, "vllm:num_requests_waiting")
        found["aborted"] += server.log.read_text(errors="replace").count(ABORTED)
        found["cpu"] += tree_ticks(server.proc.pid) / CLK_TCK
    return found


def gateway_now(metrics: str) -> dict[str, float]:
    text = fetch(metrics + "/metrics")
    return {
        "fired": total(text, "unitgate_hedges_total", outcome="fired"),
        "first": total(text, "unitgate_hedges_total", outcome="first"),
        "second": total(text, "unitgate_hedges_total", outcome="second"),
        "wasted": total(text, "unitgate_hedge_prefill_tokens_total", kind="wasted"),
    }


async def requests(url: str, count: int, prompt: int, tag: str) -> list[float]:
    """`count` streamed chats one at a time; their times to first token (s)."""
    ttfts = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as http:
        for i in range(count):
            text = f"Request {tag}-{i} of the bench. " + FILLER * (prompt // 16)
            body: dict[str, Any] = {"model": SERVED, "stream": True, "max_tokens": 8}
            body |= {"messages": [{"role": "user", "content": text}], "temperature": 0}
            began = time.monotonic()
            async with http.post(url + "/v1/chat/completions", json=body) as resp:
                first = await resp.content.readline()
                ttfts.append(time.monotonic() - began)
                rest = await resp.read()
            if resp.status != 200 or b"[DONE]" not in rest:
                raise RuntimeError(f"a request failed: {resp.status} {first[:200]!r}")
    return ttfts


def run_mode(
    servers: Sequence[Server], gateway: dict[str, Any], count: int, prompt: int, tag: str
) -> dict[str, float]:
    time.sleep(2.0)  # the last mode's aborted copies settle in the servers' counters
    before, seen = servers_now(servers), gateway_now(gateway["metrics"])
    ttfts = asyncio.run(requests(gateway["public"], count, prompt, tag))
    time.sleep(2.0)
    after, found = servers_now(servers), gateway_now(gateway["metrics"])
    ttfts.sort()
    result = {k: after[k] - before[k] for k in after} | {k: found[k] - seen[k] for k in found}
    return result | {"p50": ttfts[len(ttfts) // 2], "busy": after["busy"]}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.bench.hedge_cost", description=__doc__)
    p.add_argument("--requests", type=int, default=20, help="per gateway (20)")
    p.add_argument("--prompt", type=int, default=1000, help="about this many prompt tokens")
    p.add_argument("--delay", type=float, default=0.2, help="the hedge's delay, seconds")
    p.add_argument(
        "--vllm-python", type=Path, default=VENV_VLLM, help=f"vLLM's Python ({VENV_VLLM})"
    )
    args = p.parse_args(argv)
    if not args.vllm_python.exists():
        p.error(f"{args.vllm_python} is missing: `make .venv-vllm/.installed-vllm` installs it")
    clean_shm()
    rows: dict[str, dict[str, float]] = {}
    with (
        tempfile.TemporaryDirectory(prefix="unitgate-hedge-cost-") as tmp_name,
        contextlib.ExitStack() as stack,
    ):
        tmp = Path(tmp_name)
        model = export_smollm2(tmp / "smollm2")
        python, logged = str(args.vllm_python), "--enable-log-requests"
        servers = [launch(tmp, f"v{i}", model, logged, cpu=i, python=python) for i in range(2)]
        for server in servers:
            stack.callback(server.stop)
        started = wait_ready(servers, 300.0)
        print(f"two stock vLLM servers ready in {started:.0f} s", flush=True)
        gateways = {}
        for mode, delay in (("off", None), ("hedged", args.delay)):
            config, ready = tmp / f"{mode}.toml", tmp / f"{mode}.json"
            config.write_text(gateway_toml(servers, delay))
            argv = ["gateway", "gateway", "--config", str(config), "--log-level", "warning"]
            argv += ["--ready-file", str(ready)]
            gateways[mode] = stack.enter_context(child(argv, ready, None, f"{mode} gateway", True))
        asyncio.run(requests(gateways["off"]["public"], 2, args.prompt, "warm"))
        for mode in ("off", "hedged", "off", "hedged"):  # twice each, alternating
            found = run_mode(servers, gateways[mode], args.requests, args.prompt, mode)
            print(f"{mode}: {found}", flush=True)
            for key, value in found.items():
                rows.setdefault(mode, {})[key] = rows.get(mode, {}).get(key, 0.0) + value
    off, on = rows["off"], rows["hedged"]
    n = 2 * args.requests
    hedges = on["fired"]
    print(
        f"\nSmolLM2 on 2 stock vLLM servers, {n} requests a gateway of ~{args.prompt} prompt"
        f" tokens and 8 output tokens, one at a time; hedge delay {args.delay:g} s\n"
    )
    print(
        "| gateway | TTFT p50 s | hedges | won by the 2nd copy | prompt tokens computed a"
        " request | server CPU s a request | aborts vLLM logged | left running |"
        " wasted tokens the gateway counted |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for mode, r in (("off", off), ("hedged", on)):
        print(
            f"| {mode} | {r['p50'] / 2:.2f} | {r['fired']:.0f} | {r['second']:.0f} |"
            f" {r['computed'] / n:.0f} | {r['cpu'] / n:.2f} | {r['aborted']:.0f} |"
            f" {r['busy']:.0f} | {r['wasted']:.0f} |"
        )
    if hedges:
        extra_tokens = (on["computed"] - off["computed"]) / hedges
        extra_cpu = (on["cpu"] - off["cpu"]) / hedges
        print(
            f"\nper hedge: {extra_tokens:.0f} more prompt tokens computed by the servers"
            f" (the gateway counted {on['wasted'] / hedges:.0f} wasted), {extra_cpu:.2f} s more"
            f" server CPU; vLLM logged {on['aborted']:.0f} aborts for {hedges:.0f} hedges"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
