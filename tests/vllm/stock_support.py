"""Stock `vllm serve` processes for the tests: the real OpenAI server of the vLLM in this venv,
started by loadtest/bench/stock_vllm.py (which the benchmarks share) and held in this suite's
process helpers (a failure shows the log's tail)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from loadtest.bench.stock_vllm import answers, launch
from tests.vllm.support import START_S, Proc

# What `vllm serve` needs to answer tool calls with a named tool_choice (vLLM 0.32).
TOOL_FLAGS = ("--enable-auto-tool-choice", "--tool-call-parser", "hermes")
# What `vllm serve` needs to serve GET /tokenizer_info.
INFO_FLAGS = ("--enable-tokenizer-info-endpoint",)


@dataclass
class Stock:
    proc: Proc
    url: str
    kv_events: str = ""  # its KV event publisher and replay socket, if it was given them
    kv_replay: str = ""

    def ready(self) -> bool:
        return answers(self.url)


def start_stock(
    tmp: Path, name: str, model: Path, *extra: str, cpu: int = 0, kv: bool = False
) -> Stock:
    """`kv`: publishing its KV cache events (stock_vllm.kv_flags)."""
    server = launch(tmp, name, model, *extra, cpu=cpu, kv=kv)
    return Stock(Proc(server.proc, server.log), server.url, server.kv_events, server.kv_replay)


def wait_ready(servers: list[Stock], within: float = START_S) -> float:
    """Seconds until every server answers /health 200; fails with a log tail otherwise."""
    start = time.monotonic()
    for server in servers:
        while not server.ready():
            if server.proc.proc.poll() is not None or time.monotonic() - start > within:
                raise AssertionError(f"{server.url} did not start:\n{server.proc.tail()}")
            time.sleep(0.5)
    return time.monotonic() - start
