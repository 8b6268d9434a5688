"""A stock multi-node vLLM unit for the tests: `vllm serve` as its leader, a `--headless`
tensor-parallel follower, and `unitgate watch` answering the node contract for the follower.

Each process runs in its own session (one killpg ends it with its engine core and workers), on
ports the OS hands out, with the environment multi-node vLLM needs on one CPU machine: every
node at 127.0.0.1 and pinned to a core of its own.
"""

from __future__ import annotations

import contextlib
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

from engine.backends.vllm.env import clean_shm
from gateway.base.ports import free_port
from tests.engine.test_up_support import eventually
from tests.vllm.support import START_S, Proc, group_gone, spawn

SHIM = Path(__file__).with_name("vllm_cli.py")  # the `vllm` command (see its docstring)
SERVED = "tiny"


@dataclass
class StockUnit:
    leader: Proc
    follower: Proc
    url: str  # the leader's OpenAI server
    started: float  # time.time() before the first node started
    watch: Proc | None = None
    watch_url: str = ""

    @property
    def procs(self) -> list[Proc]:
        return [p for p in (self.leader, self.follower, self.watch) if p is not None]

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=2) as resp:
                return int(resp.status) == 200
        except (urllib.error.URLError, OSError):
            return False

    def wait_ready(self, within: float = START_S) -> float:
        """Seconds until the leader answers /health 200 (it does once the follower joined);
        fails with both nodes' log tails if a node exits or time runs out."""
        start = time.monotonic()
        while not self.ready():
            for node in (self.leader, self.follower):
                if node.proc.poll() is not None:
                    raise AssertionError(
                        f"{node.out.name}: exited {node.proc.returncode} while the unit started:"
                        f"\n{self.tails()}"
                    )
            if time.monotonic() - start > within:
                raise AssertionError(f"the unit did not start within {within} s:\n{self.tails()}")
            time.sleep(0.5)
        return time.monotonic() - start

    def tails(self) -> str:
        return "\n".join(f"--- {p.out.name}\n{p.tail()}" for p in self.procs)

    def stop(self) -> None:
        """Continue (a stopped process holds on to its group) and kill every group, wait until
        each is empty, remove the shared memory the nodes leaked."""
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGCONT)
            proc.kill_group()
        for proc in self.procs:
            eventually(partial(group_gone, proc), 30, f"{proc.out.name} ends")
        clean_shm(since=self.started)


def node_env(rank: int) -> dict[str, str]:
    return {
        **os.environ,
        "VLLM_HOST_IP": "127.0.0.1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": str(rank % (os.cpu_count() or 1)),
        "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "PYTHONUNBUFFERED": "1",
    }


def start_node(tmp: Path, model: Path, rank: int, world: int, master: int, api: int) -> Proc:
    """`vllm serve` for one rank: the leader serves the API on `api`, the others run headless."""
    argv = [
        *(sys.executable, str(SHIM), "serve", str(model), "--served-model-name", SERVED),
        *("--dtype", "float32", "--enforce-eager", "--max-model-len", "1024"),
        *("--tensor-parallel-size", str(world), "--nnodes", str(world)),
        *("--node-rank", str(rank), "--master-addr", "127.0.0.1", "--master-port", str(master)),
        *("--host", "127.0.0.1", "--port", str(api)),
        *(["--headless"] if rank > 0 else []),
    ]
    log = tmp / f"rank{rank}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=node_env(rank),
            cwd=tmp,
            start_new_session=True,
        )
    return Proc(proc, log)


def start_unit(tmp: Path, model: Path) -> StockUnit:
    """A TP=2 unit: the headless follower first, then the leader."""
    started = time.time()
    master, api = free_port(), free_port()
    follower = start_node(tmp, model, 1, 2, master, api)
    leader = start_node(tmp, model, 0, 2, master, api)
    return StockUnit(leader, follower, f"http://127.0.0.1:{api}", started)


def start_watch(tmp: Path, unit: StockUnit, unit_id: str) -> None:
    """`unitgate watch` on the follower's main process, as rank 1 of `unit_id`."""
    args = ("--pid", str(unit.follower.pid), "--unit", unit_id, "--rank", "1")
    unit.watch = spawn(tmp, "watch", "watch", *args, "--host", "127.0.0.1", "--port", "0")
    port = unit.watch.wait_line("health_port=", 30)
    unit.watch_url = f"http://127.0.0.1:{port}"
