"""Stock `vllm serve` processes for the tests: the real OpenAI server of the vLLM in this venv,
on OS-assigned ports, each in its own session (one killpg ends its engine core too)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from engine.model.export import main as export
from gateway.base.ports import free_port
from tests.vllm.support import START_S, Proc

SERVED = "smol"  # the name the stock servers know the model by (`--served-model-name`)
# What `vllm serve` needs to answer tool calls with a named tool_choice (vLLM 0.32).
TOOL_FLAGS = ("--enable-auto-tool-choice", "--tool-call-parser", "hermes")
# What `vllm serve` needs to serve GET /tokenizer_info.
INFO_FLAGS = ("--enable-tokenizer-info-endpoint",)


def kv_flags(tmp: Path, name: str) -> tuple[tuple[str, ...], str, str]:
    """`--kv-events-config` for a server publishing its KV cache events on sockets in `tmp`
    (ipc: nothing listens beyond this machine), and the two addresses the gateway reads."""
    events, replay = f"ipc://{tmp}/{name}-kv", f"ipc://{tmp}/{name}-kv-replay"
    config = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": events,
        "replay_endpoint": replay,
    }
    return ("--kv-events-config", json.dumps(config)), events, replay


@dataclass
class Stock:
    proc: Proc
    url: str
    kv_events: str = ""  # its KV event publisher and replay socket, if it was given them
    kv_replay: str = ""

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=2) as resp:
                return resp.status == 200
        except (urllib.error.URLError, OSError):
            return False


def export_smollm2(folder: Path) -> Path:
    """The SmolLM2 Hugging Face folder, written from the packaged GGUF (no download)."""
    assert export([str(folder), "--model", "smollm2"]) == 0
    return folder


def start_stock(
    tmp: Path, name: str, model: Path, *extra: str, cpu: int = 0, kv: bool = False
) -> Stock:
    """`kv`: publishing its KV cache events (kv_flags)."""
    port = free_port()
    events = replay = ""
    if kv:
        flags, events, replay = kv_flags(tmp, name)
        extra = (*extra, *flags)
    env = {
        **os.environ,
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": str(cpu % (os.cpu_count() or 1)),
        "HF_HUB_OFFLINE": "1",
        "VLLM_ENABLE_RESPONSES_API_STORE": "1",  # stored responses, as docs/fronting.md says
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "PYTHONUNBUFFERED": "1",
    }
    argv = [
        *(sys.executable, "-m", "vllm.entrypoints.openai.api_server"),
        *("--model", str(model), "--served-model-name", SERVED),
        *("--dtype", "float32", "--enforce-eager", "--max-model-len", "2048"),
        *("--host", "127.0.0.1", "--port", str(port)),
        *extra,
    ]
    log = tmp / f"{name}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=tmp,
            start_new_session=True,
        )
    return Stock(Proc(proc, log), f"http://127.0.0.1:{port}", events, replay)


def wait_ready(servers: list[Stock], within: float = START_S) -> float:
    """Seconds until every server answers /health 200; fails with a log tail otherwise."""
    start = time.monotonic()
    for server in servers:
        while not server.ready():
            if server.proc.proc.poll() is not None or time.monotonic() - start > within:
                raise AssertionError(f"{server.url} did not start:\n{server.proc.tail()}")
            time.sleep(0.5)
    return time.monotonic() - start
