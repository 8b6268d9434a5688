"""`python -m loadtest.bench.vllm --out DIR`: the builtin engine and vLLM, side by side.

Both backends serve the same tiny Llama checkpoint (`engine.backends.vllm.tinymodel`, float32)
as a unit of two nodes (TP=2 over Gloo on 127.0.0.1), started together by `unitgate up` from
one config behind one gateway, which routes by model id ("builtin" or "vllm"). The load is
streamed chat completions through the gateway, greedy with ignore_eos so every request decodes
exactly `--tokens` tokens, at 1 and then 8 concurrent requests, the two backends taking turns
at each level so both see the same machine.

Reported per backend and level: time to first token (first SSE chunk carrying a token, from
the request being sent; p50 and p90) and throughput (all tokens / wall time of the level).
Needs the vLLM environment (`make vllm-env`); `make bench-vllm` runs it there.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import aiohttp

from engine.backends.vllm.tinymodel import write_tiny_model
from gateway.base.ports import free_port
from loadtest.bench.machine import machine_facts

BACKENDS = ("builtin", "vllm")
READY_S = 600.0


@dataclass(frozen=True, slots=True)
class Result:
    backend: str
    concurrency: int
    requests: int
    tokens: int
    wall_s: float
    tokens_per_s: float
    ttft_p50_ms: float
    ttft_p90_ms: float


def write_config(path: Path, model: Path) -> None:
    units = []
    for backend in BACKENDS:
        ports = (free_port(), free_port())
        nodes = ", ".join(f'"http://127.0.0.1:{p}"' for p in ports)
        extra = 'engine_args = { dtype = "float32" }\n' if backend == "vllm" else ""
        units.append(
            f'[[units]]\nid = "{backend}"\nleader = "http://127.0.0.1:{ports[0]}"\n'
            f'nodes = [{nodes}]\nmodels = ["{backend}"]\nbackend = "{backend}"\n'
            f'model = "{model}"\n{extra}'
        )
    path.write_text(
        '[gateway]\nport = 0\nmodels = ["builtin", "vllm"]\n[metrics]\nport = 0\n'
        "[admin]\nenabled = false\n[health]\ntimeout = 2.0\nstall_timeout = 30.0\n"
        "[timeouts]\nfirst_byte = 120.0\n" + "\n".join(units)
    )


def start_up(out: Path, config: Path) -> tuple[subprocess.Popen[bytes], str]:
    log = out / "up.log"
    (out / "logs").mkdir(exist_ok=True)
    with log.open("wb") as f:
        proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "gateway", "up", "--config", str(config)),
                "--log-dir",
                str(out / "logs"),
            ],
            stdout=f,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + READY_S
    while time.monotonic() < deadline:
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith("unitgate up ready "):
                return proc, line.removeprefix("unitgate up ready ").strip()
        if proc.poll() is not None:
            break
        time.sleep(0.5)
    stop_up(proc)
    raise SystemExit(f"unitgate up did not get ready; see {log} and {out / 'logs'}")


def stop_up(proc: subprocess.Popen[bytes]) -> None:
    """SIGINT is `unitgate up`'s orderly stop; the group kill is for whatever outlives it."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(90)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)


async def one_request(
    http: aiohttp.ClientSession, url: str, model: str, tokens: int
) -> tuple[float, int]:
    """(seconds to the first token, tokens received) of one streamed chat completion."""
    body = {
        "model": model,
        "stream": True,
        "max_tokens": tokens,
        "temperature": 0,
        "ignore_eos": True,
        "return_token_ids": True,
        "messages": [{"role": "user", "content": "Tell me about units and gateways."}],
    }
    sent, first, count = time.perf_counter(), None, 0
    async with http.post(f"{url}/v1/chat/completions", json=body) as resp:
        resp.raise_for_status()
        async for raw in resp.content:
            line = raw.strip()
            if not line.startswith(b"data: {"):
                continue
            choices = json.loads(line[6:]).get("choices") or [{}]
            got = len(choices[0].get("token_ids") or [])
            if got and first is None:
                first = time.perf_counter() - sent
            count += got
    if first is None or count != tokens:
        raise RuntimeError(f"{model}: expected {tokens} tokens, got {count}")
    return first, count


async def level(url: str, backend: str, concurrency: int, requests: int, tokens: int) -> Result:
    gate = asyncio.Semaphore(concurrency)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as http:

        async def run() -> tuple[float, int]:
            async with gate:
                return await one_request(http, url, backend, tokens)

        await one_request(http, url, backend, 4)  # connections and caches warm, not measured
        start = time.perf_counter()
        done = await asyncio.gather(*(run() for _ in range(requests)))
        wall = time.perf_counter() - start
    ttfts = sorted(t * 1000 for t, _ in done)
    total = sum(n for _, n in done)
    p90 = ttfts[min(len(ttfts) - 1, int(0.9 * len(ttfts)))]
    return Result(
        backend,
        concurrency,
        requests,
        total,
        round(wall, 3),
        round(total / wall, 1),
        round(statistics.median(ttfts), 1),
        round(p90, 1),
    )


def print_table(results: list[Result]) -> None:
    print(f"{'backend':8} {'conc':>4} {'reqs':>4} {'tok/s':>8} {'TTFT p50':>9} {'p90':>8}")
    for r in results:
        print(
            f"{r.backend:8} {r.concurrency:>4} {r.requests:>4} {r.tokens_per_s:>8.1f} "
            f"{r.ttft_p50_ms:>7.1f}ms {r.ttft_p90_ms:>6.1f}ms"
        )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.bench.vllm", description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("bench-out/vllm"))
    parser.add_argument("--tokens", type=int, default=64, help="tokens per request")
    parser.add_argument("--requests", type=int, default=8, help="requests per concurrent slot")
    args = parser.parse_args(argv)
    out: Path = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    facts = machine_facts()
    model = write_tiny_model(out / "tiny-llama")
    write_config(out / "config.toml", model)
    proc, url = start_up(out, out / "config.toml")
    results: list[Result] = []
    try:
        for concurrency in (1, 8):
            requests = max(args.requests, concurrency * 3)
            for backend in BACKENDS:
                results.append(asyncio.run(level(url, backend, concurrency, requests, args.tokens)))
    finally:
        stop_up(proc)
    print_table(results)
    report = {"machine": facts, "tokens_per_request": args.tokens}
    report["results"] = [asdict(r) for r in results]
    (out / "vllm.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out / 'vllm.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
