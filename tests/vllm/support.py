"""vLLM node and gateway processes for the tests: free ports, bounded waits, nothing left behind.

Every process starts in its own session, so its vLLM engine core and workers share its process
group and one killpg ends them all, whatever state the test left them in."""

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
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from engine.backends.vllm.env import clean_shm
from gateway.base.ports import free_port
from tests.engine.test_up_support import Proc as UpProc
from tests.engine.test_up_support import eventually

ROOT = Path(__file__).resolve().parents[2]
START_S = 300.0  # a cold vLLM unit on two busy cores; measured 35-75 s per engine when idle


class Proc(UpProc):
    """A `gateway` process in its own session: vLLM's engine core and workers join its group."""

    @property
    def pid(self) -> int:
        return self.proc.pid

    def tail(self) -> str:
        lines = [ln for ln in self.text().splitlines() if "WARNING: Location" not in ln]
        return "\n".join(lines[-40:])

    def group_alive(self) -> bool:
        """Any process left in this node's group (its vLLM children included)?"""
        try:
            os.killpg(self.pid, 0)
        except ProcessLookupError:
            return False
        return True

    def kill_group(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(15)


def spawn(tmp: Path, name: str, *args: str) -> Proc:
    log = tmp / f"{name}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gateway", *args],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"},
            cwd=tmp,
            start_new_session=True,
        )
    return Proc(proc, log)


def node_flags(
    model: Path, unit: str, rank: int, world: int, master: str, vllm_args: dict[str, Any]
) -> list[str]:
    return [
        *("node", "--backend", "vllm", "--model", str(model), "--unit", unit),
        *("--rank", str(rank), "--world-size", str(world), "--master", master),
        *("--role", "leader" if rank == 0 else "follower", "--max-seq-len", "1024"),
        *("--vllm-args", json.dumps({"dtype": "float32", **vllm_args})),
    ]


@dataclass
class Unit:
    leader: Proc
    followers: list[Proc]
    api: str  # the leader's base URL
    health: list[str]  # every node's /health URL, rank order (the leader's: its thread listener)
    started: float  # time.time() before the first node started

    @property
    def procs(self) -> list[Proc]:
        return [self.leader, *self.followers]

    def wait_ready(self, within: float = START_S) -> None:
        deadline = time.monotonic() + within
        for proc in self.procs:
            proc.wait_line("health_port=", max(1.0, deadline - time.monotonic()))

    def stop(self) -> None:
        """Kill every node's group, wait until it is empty, remove the memory it leaked."""
        for proc in self.procs:
            proc.kill_group()
        for proc in self.procs:
            eventually(partial(group_gone, proc), 30, f"{proc.out.name} ends")
        clean_shm(since=self.started)


def start_unit(
    tmp: Path,
    model: Path,
    unit: str,
    world: int,
    served: str = "tiny",
    vllm_args: dict[str, Any] | None = None,
) -> Unit:
    """Followers first, then the leader; ready once every node announced its port.
    `vllm_args`: `vllm serve` arguments besides float32 (every node gets them)."""
    started = time.time()
    extra = vllm_args or {}
    master = f"127.0.0.1:{free_port()}"
    api, *ports = [free_port() for _ in range(world + 1)]  # ports: /health, rank order
    followers = [
        spawn(
            tmp,
            f"{unit}-rank{rank}",
            *node_flags(model, unit, rank, world, master, extra),
            *("--health-port", str(ports[rank])),
        )
        for rank in range(1, world)
    ]
    leader = spawn(
        tmp,
        f"{unit}-rank0",
        *node_flags(model, unit, 0, world, master, extra),
        *("--port", str(api), "--health-port", str(ports[0]), "--served-model-name", served),
    )
    health = [f"http://127.0.0.1:{p}/health" for p in ports]
    return Unit(leader, followers, f"http://127.0.0.1:{api}", health, started)


def get_json(url: str, timeout: float = 5.0) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def group_gone(proc: Proc) -> bool:
    """Nothing left in the process group of `proc` (its vLLM engine core and workers)."""
    return not proc.group_alive()


def write_gateway_config(path: Path, unit: Unit) -> None:
    nodes = ", ".join(f'"{u.removesuffix("/health")}"' for u in unit.health)
    path.write_text(
        '[gateway]\nport = 0\nmodels = ["tiny"]\nshutdown_timeout = 5.0\n'
        "[metrics]\nport = 0\n[admin]\nenabled = false\n"
        # Three vLLM engines share two cores here: probes get room to answer late, and the
        # stall check is left to the node's own (longer) one.
        "[health]\ntimeout = 2.0\nfall = 2\nstall_timeout = 30.0\n"
        f'[[units]]\nid = "u0"\nleader = "{unit.api}"\nnodes = [{nodes}]\n'
    )


def start_gateway(tmp: Path, unit: Unit) -> tuple[Proc, str]:
    write_gateway_config(tmp / "gateway.toml", unit)
    ready = tmp / "gateway.ready.json"
    proc = spawn(
        tmp, "gateway", "gateway", "--config", str(tmp / "gateway.toml"), "--ready-file", str(ready)
    )
    deadline = time.monotonic() + 60
    while not ready.exists():
        if proc.proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"gateway did not start:\n{proc.tail()}")
        time.sleep(0.1)
    public: str = json.loads(ready.read_text())["public"]
    return proc, public
