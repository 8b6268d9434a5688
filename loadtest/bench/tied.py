"""`python -m loadtest.bench.tied`: tied requests on builtin units, what they save and waste.

Two builtin units of SmolLM2 (the packaged GGUF, one node each, one torch thread, 4 KV
slots: `unitgate node` processes) and four gateways of this tree over them, used in turn:
hedging off; hedged after the delay (`[hedge] tie = false`), with the defaults (nothing is
predicted here, so the delay is `max_delay`, 2 s; the budget 5% of prefill tokens) and with a
0.5 s delay and no budget; and tied (the default where units announce their starts). The same
requests go through each, one at a time (streamed chats of a short question, 16 output
tokens), in two phases:

- **idle**: both units idle. A tied pair's twin should not go (the first copy starts within
  `tie_delay`), so nothing is wasted and nothing is gained.
- **u0 full**: u0's 4 slots are held by 4 streams sent to it directly, in a closed loop (another
  replica's traffic: this gateway does not read the leaders' load, `[routing] engine_load =
  false`), and u0 is the picker's first choice (u1 has half its weight), so each request's
  first copy goes to u0. Without hedging it waits
  in u0's queue for a slot; a delayed hedge goes after its delay; a tied twin goes after
  `tie_delay` and u1 starts it.

Reported per phase and gateway: TTFT p50, p90 and max (measured by the client, to the first
event), the answers u1 gave, the hedges (`fired` after the delay, `tied` at once), the prefill
tokens the gateway counted wasted, and the prompt tokens each engine was asked to prefill per
request (its `prefix_cache_queries`: a copy closed in its queue is never counted).

    python -m loadtest.bench.tied [--requests 30]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import aiohttp

from gateway.base.ports import free_port
from loadtest.bench.prefix.scrape import total
from loadtest.bench.processes import child, stop_child

MODEL = "smollm2-bench"
NODE = ("--model", "smollm2", "--weight-dtype", "gguf", "--threads", "1", "--num-slots", "4")
MODES = {
    "off": "",
    "delayed": "enabled = true\ntie = false\n",
    "delayed 0.5 s": "enabled = true\ntie = false\nmin_delay = 0.5\nmax_delay = 0.5\n"
    "budget_share = 1.0\n",
    "tied": "enabled = true\n",
}
QUESTION = "Which running shoes suit flat feet? Answer briefly."
HOG = "Write a long story about a shop that sells shoes, with many details."


def node(port: int, unit: str, logs: Path) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "engine", "--role", "leader", "--world-size", "1"]
    argv += ["--rank", "0", "--master", f"127.0.0.1:{free_port()}", "--unit", unit]
    argv += ["--port", str(port), "--served-model-name", MODEL, "--max-seq-len", "1024", *NODE]
    with (logs / f"{unit}.log").open("wb") as log:
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)


@contextlib.contextmanager
def units(logs: Path) -> Iterator[list[str]]:
    ports = [free_port(), free_port()]
    procs = [node(port, f"u{i}", logs) for i, port in enumerate(ports)]
    try:
        urls = [f"http://127.0.0.1:{port}" for port in ports]
        asyncio.run(healthy(urls, procs))
        yield urls
    finally:
        for proc in procs:
            stop_child(proc)


async def healthy(urls: list[str], procs: list[subprocess.Popen[bytes]]) -> None:
    deadline = time.monotonic() + 120.0
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as http:
        for url, proc in zip(urls, procs, strict=True):
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"the node at {url} exited ({proc.returncode})")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the node at {url} was not healthy within 120 s")
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    async with http.get(url + "/health") as resp:
                        if resp.status == 200:
                            break
                await asyncio.sleep(0.5)


def gateway_config(urls: list[str], hedge: str) -> str:
    units = "".join(
        f'[[units]]\nid = "u{i}"\nleader = "{url}"\nnodes = ["{url}"]\nweight = {1.0 - i / 2}\n'
        for i, url in enumerate(urls)
    )
    return (
        f'[gateway]\nport = 0\nmodels = ["{MODEL}"]\n'
        "[metrics]\nport = 0\n[admin]\nenabled = false\n"
        '[routing]\naffinity = "none"\nengine_load = false\nlatency_model = "off"\n'
        "[health]\nenabled = true\n[timeouts]\nfirst_byte = 60.0\n"
        f"[hedge]\n{hedge}" + units
    )


async def hog(http: aiohttp.ClientSession, url: str, stop: asyncio.Event) -> None:
    """One of u0's slots, held by back-to-back streams sent to it directly."""
    body: dict[str, Any] = {"model": MODEL, "stream": True, "max_tokens": 48}
    body |= {"messages": [{"role": "user", "content": HOG}], "ignore_eos": True}
    while not stop.is_set():
        async with http.post(url + "/v1/chat/completions", json=body) as resp:
            await resp.read()


async def queries(http: aiohttp.ClientSession, urls: list[str]) -> list[int]:
    counts = []
    for url in urls:
        async with http.get(url + "/health") as resp:
            counts.append(int((await resp.json()).get("prefix_cache_queries", 0)))
    return counts


async def scrape(http: aiohttp.ClientSession, metrics: str) -> dict[str, float]:
    """The gateway's hedges (fired after the delay, tied, refused) and wasted prefill tokens."""
    async with http.get(metrics + "/metrics") as resp:
        text = await resp.text()
    outcomes = ("fired", "tied", "refused_budget", "refused_overloaded", "refused_no_unit")
    found = {o: total(text, "unitgate_hedges_total", outcome=o) for o in outcomes}
    found["wasted"] = total(text, "unitgate_hedge_prefill_tokens_total", kind="wasted")
    return found


async def phase(
    gateway: dict[str, Any], urls: list[str], requests: int, full: bool
) -> dict[str, Any]:
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        stop = asyncio.Event()
        hogs = [asyncio.create_task(hog(http, urls[0], stop)) for _ in range(4 if full else 0)]
        await asyncio.sleep(1.0 if full else 0.0)  # the hogs hold u0's slots
        before, seen = await queries(http, urls), await scrape(http, gateway["metrics"])
        body: dict[str, Any] = {"model": MODEL, "stream": True, "max_tokens": 16}
        body |= {"messages": [{"role": "user", "content": QUESTION}], "ignore_eos": True}
        ttfts: list[float] = []
        by_u1 = 0
        for _ in range(requests):
            began = time.monotonic()
            url = gateway["public"] + "/v1/chat/completions"
            async with http.post(url, json=body) as resp:
                first = await resp.content.readline()
                ttfts.append(time.monotonic() - began)
                rest = await resp.read()
                if resp.status != 200 or not first.startswith(b"data:") or b"[DONE]" not in rest:
                    raise RuntimeError(f"a request failed: {resp.status} {first[:120]!r}")
                by_u1 += resp.headers.get("x-unitgate-unit") == "u1"
        after, found = await queries(http, urls), await scrape(http, gateway["metrics"])
        stop.set()
        await asyncio.gather(*hogs)
    ttfts.sort()
    delta = {k: v - seen.get(k, 0.0) for k, v in found.items()}
    return {
        "p50": ttfts[len(ttfts) // 2],
        "p90": ttfts[min(len(ttfts) - 1, math.ceil(0.9 * len(ttfts)) - 1)],
        "max": ttfts[-1],
        "by_u1": by_u1,
        "fired": delta.get("fired", 0.0),
        "tied": delta.get("tied", 0.0),
        "refused": {k[8:]: v for k, v in delta.items() if k.startswith("refused_") and v},
        "wasted": delta.get("wasted", 0.0),
        "queried": [(a - b) / requests for a, b in zip(after, before, strict=True)],
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.bench.tied", description=__doc__)
    p.add_argument("--requests", type=int, default=30, help="per phase and gateway (30)")
    args = p.parse_args(argv)
    rows: list[tuple[str, str, dict[str, Any]]] = []
    with (
        tempfile.TemporaryDirectory(prefix="unitgate-tied-") as tmp_name,
        contextlib.ExitStack() as stack,
    ):
        tmp = Path(tmp_name)
        urls = stack.enter_context(units(tmp))
        gateways = {}
        for mode, hedge in MODES.items():
            name = mode.replace(" ", "-")
            (tmp / f"{name}.toml").write_text(gateway_config(urls, hedge))
            ready = tmp / f"{name}.json"
            argv = ["gateway", "gateway", "--config", str(tmp / f"{name}.toml")]
            argv += ["--log-level", "warning", "--ready-file", str(ready)]
            gateways[mode] = stack.enter_context(child(argv, ready, None, f"{mode} gateway", True))
        for name, full in (("idle", False), ("u0 full", True)):
            for mode in MODES:
                found = asyncio.run(phase(gateways[mode], urls, args.requests, full))
                rows.append((name, mode, found))
                print(f"{name} {mode}: {found}", flush=True)
    print(f"\nSmolLM2 gguf, 2 builtin units of 1 node (4 slots), {args.requests} requests a row\n")
    print("| phase | gateway | TTFT p50 ms | p90 ms | max ms | answered by u1 | hedges |"
          " wasted prefill tokens | prompt tokens prefilled a request, u0 / u1 |")  # fmt: skip
    print("|---|---|---:|---:|---:|---:|---|---:|---|")
    for name, mode, f in rows:
        hedges = f"{f['fired']:.0f} fired, {f['tied']:.0f} tied"
        if f["refused"]:
            hedges += ", refused: " + ", ".join(f"{n:.0f} {k}" for k, n in f["refused"].items())
        u0, u1 = f["queried"]
        u0_text = f"{u0:.0f}" if name == "idle" else f"{u0:.0f} (with u0's own streams)"
        print(
            f"| {name} | {mode} | {f['p50'] * 1e3:.0f} | {f['p90'] * 1e3:.0f} |"
            f" {f['max'] * 1e3:.0f} | {f['by_u1']} | {hedges} | {f['wasted']:.0f} |"
            f" {u0_text} / {u1:.0f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
