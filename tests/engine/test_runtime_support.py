"""Real unit processes for the runtime tests: free ports, node subprocesses, bounded waits.

(Helpers only; named test_runtime_* to live beside the tests it serves.)"""

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
from typing import Any

from engine.backends.builtin.node import start_leader
from engine.flags import parse
from engine.model import ByteTokenizer
from engine.runtime import LeaderEngine
from gateway.base.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
MAX_SEQ_LEN = 1200  # room for a prompt that overflows the one-broadcast step frame
PROMPT = tuple(ByteTokenizer().apply_chat_template([{"role": "user", "content": "hi, unit!"}]))


def start_unit(
    tmp: Path, timeout: float, *leader_flags: str, shape: tuple[str, ...] = ()
) -> tuple[LeaderEngine, Node]:
    """The leader in this process (rank 0), one follower subprocess (rank 1); `shape`: flags
    both nodes get (`--pp 2`: the two are pipeline stages)."""
    master = f"127.0.0.1:{free_port()}"
    flags = ("--collective-timeout", str(timeout), "--max-seq-len", str(MAX_SEQ_LEN), *shape)
    follower = spawn_node(tmp, "follower", 1, 2, master, *flags)
    try:
        flags = ["--role", "leader", "--world-size", "2", "--master", master, "--num-slots", "4"]
        flags += ["--max-seq-len", str(MAX_SEQ_LEN)]
        flags += ["--collective-timeout", str(timeout), "--connect-timeout", "30"]
        return start_leader(parse([*flags, *shape, *leader_flags])), follower
    except BaseException:
        kill_all(follower)
        raise


@dataclass
class Node:
    proc: subprocess.Popen[bytes]
    out: Path
    err: Path

    def health_port(self, deadline_s: float = 30.0) -> int:
        """The node prints `health_port=N` once it has joined the group."""
        deadline = time.monotonic() + deadline_s
        while time.monotonic() < deadline:
            for line in self.out.read_text().splitlines():
                if line.startswith("health_port="):
                    return int(line.split("=", 1)[1])
            if self.proc.poll() is not None:
                raise AssertionError(f"node exited {self.proc.returncode}: {self.log()}")
            time.sleep(0.05)
        raise AssertionError(f"node printed no health port in {deadline_s} s: {self.log()}")

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout)

    def log(self) -> str:
        return self.err.read_text()[-3000:]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def spawn_node(tmp: Path, role: str, rank: int, world: int, master: str, *extra: str) -> Node:
    out, err = tmp / f"{role}{rank}.out", tmp / f"{role}{rank}.err"
    args = [
        *("--role", role, "--rank", str(rank), "--world-size", str(world)),
        *("--master", master, "--unit", "u1", "--threads", "1", "--num-slots", "4"),
        *extra,
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with out.open("wb") as o, err.open("wb") as e:
        proc = subprocess.Popen(
            [sys.executable, "-m", "engine.backends.builtin.bare", *args],
            stdout=o,
            stderr=e,
            env=env,
        )
    return Node(proc, out, err)


def get_health(port: int) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def kill_all(*nodes: Node | None) -> None:
    for node in nodes:
        if node is not None:
            node.kill()
