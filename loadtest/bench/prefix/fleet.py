"""The stock vLLM servers every mode routes to: started once for the whole benchmark, each
publishing its KV cache events, its engine on a core of its own, its cache of a set size.

vLLM's dev mode (`VLLM_SERVER_DEV_MODE=1`) serves `POST /reset_prefix_cache`: every mode
starts from empty caches over the same servers, where restarting them would cost a minute or
more each time and distinct prefixes per mode would measure different prompts. A reset also
publishes `AllBlocksCleared`, so the precise gateway's index empties with the caches.
"""

from __future__ import annotations

import contextlib
import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from engine.backends.vllm.env import clean_shm
from loadtest.bench.prefix import scrape
from loadtest.bench.stock_vllm import SERVED, Server, launch, wait_ready

START_S = 300.0  # two cold vLLM servers on two busy cores; 35-75 s each when idle
RESET_TRIES = 40  # a reset fails while a block is still held; 0.25 s apart


@dataclass(frozen=True)
class Fleet:
    servers: tuple[Server, ...]

    @property
    def urls(self) -> tuple[str, ...]:
        return tuple(s.url for s in self.servers)

    def metrics(self) -> dict[str, str]:
        return {s.url: fetch(s.url + "/metrics") for s in self.servers}

    def caches(self) -> dict[str, scrape.Cache]:
        return {url: scrape.cache(text) for url, text in self.metrics().items()}

    def reset(self) -> None:
        """Every server's prefix cache emptied. vLLM publishes the reset's `AllBlocksCleared`
        with the events of its next step, so each then answers a prompt shorter than a block
        (which caches nothing): until then a gateway reading its events would hold the
        blocks it had before."""
        for server in self.servers:
            _reset(server.url)
        self.warm()

    def warm(self) -> None:
        """One short answer from each server: with an explicit KV size vLLM skips its warm-up
        pass, so its first request would pay for it in the first mode's TTFT."""
        hello = [{"role": "user", "content": "Hello there."}]
        ask = {"model": SERVED, "messages": hello, "max_tokens": 1, "temperature": 0}
        for server in self.servers:
            post(server.url + "/v1/chat/completions", json.dumps(ask).encode(), 300.0)


@contextlib.contextmanager
def fleet(
    tmp: Path, model: Path, servers: int, kv_cache_bytes: int, python: str
) -> Iterator[Fleet]:
    """`servers` of `model` with `kv_cache_bytes` of KV cache each, server i's engine on core
    i (mod the cores); stopped, and the shared memory they leaked removed, on exit."""
    started = time.time()
    env = {"VLLM_SERVER_DEV_MODE": "1", "VLLM_RPC_BASE_PATH": str(tmp)}
    running: list[Server] = []
    try:
        for i in range(servers):
            running.append(
                launch(
                    tmp,
                    f"vllm{i}",
                    model,
                    # each answer's usage says its cached tokens, which the gateway checks its
                    # predictions against
                    "--enable-prompt-tokens-details",
                    cpu=i,
                    kv=True,
                    kv_cache_bytes=kv_cache_bytes,
                    python=python,
                    env=env,
                )
            )
        took = wait_ready(running, START_S)
        print(f"{servers} vLLM servers ready in {took:.0f} s", flush=True)
        yield Fleet(tuple(running))
    finally:
        for server in running:
            server.stop()
        clean_shm(since=started)


def fetch(url: str, timeout: float = 10.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return str(resp.read().decode())


def post(url: str, data: bytes, timeout: float = 10.0) -> bytes:
    request = urllib.request.Request(
        url, data=data, method="POST", headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as resp:
        return bytes(resp.read())


def _reset(url: str) -> None:
    for _ in range(RESET_TRIES):
        with contextlib.suppress(urllib.error.URLError, OSError):
            if json.loads(post(url + "/reset_prefix_cache", b"")).get("success"):
                return
        time.sleep(0.25)
    raise RuntimeError(f"{url}: POST /reset_prefix_cache did not succeed")


def version(url: str) -> str:
    try:
        return str(json.loads(fetch(url + "/version")).get("version", "unknown"))
    except (urllib.error.URLError, OSError, ValueError):
        return "unknown"
