"""A real unit of two builtin nodes, started as `unitgate up` starts one (a `unitgate node`
process per rank), every port chosen by the OS and read from what the nodes print."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from gateway.base.ports import free_port
from loadtest.bench.processes import pinned, stop_child

MODEL = "tiny"


@dataclass(frozen=True, slots=True)
class Unit:
    api_port: int  # the OpenAI API, which also answers /health (from its event loop)
    health_port: int  # the leader's thread listener
    follower_port: int
    leader_pid: int


@dataclass(frozen=True, slots=True)
class Pins:
    leader: int  # the leader's CPU, its own
    rest: int  # the follower's, the load generator's and the prober's


def pins() -> Pins | None:
    cpus = sorted(os.sched_getaffinity(0))
    return Pins(leader=cpus[0], rest=cpus[1]) if len(cpus) >= 2 else None


@contextlib.contextmanager
def running_unit(logs: Path, num_slots: int, cpus: Pins | None, within: float) -> Iterator[Unit]:
    """Follower first (it waits for the leader's rendezvous); ready once both announced their
    ports. Both are stopped on the way out, whatever happened."""
    master = f"127.0.0.1:{free_port()}"
    common = ["--unit", "bench", "--world-size", "2", "--master", master, "--threads", "1"]
    common += ["--num-slots", str(num_slots), "--model", MODEL]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        follower_argv = ["--role", "follower", "--rank", "1", *common]
        follower = _node(logs / "follower.log", follower_argv, None if cpus is None else cpus.rest)
        procs.append(follower)
        leader_argv = ["--role", "leader", "--rank", "0", "--port", "0", "--health-port", "0"]
        leader = _node(
            logs / "leader.log", [*leader_argv, *common], None if cpus is None else cpus.leader
        )
        procs.append(leader)
        deadline = time.monotonic() + within
        ports = _lines(leader, logs / "leader.log", ("api_port=", "health_port="), deadline)
        (follower_port,) = _lines(follower, logs / "follower.log", ("health_port=",), deadline)
        yield Unit(ports[0], ports[1], follower_port, leader.pid)
    finally:
        for proc in reversed(procs):  # the leader first: its STOP ends the follower cleanly
            stop_child(proc)


def _node(log: Path, flags: list[str], cpu: int | None) -> subprocess.Popen[bytes]:
    with log.open("wb") as out, pinned(cpu):
        return subprocess.Popen(
            [sys.executable, "-m", "gateway", "node", *flags],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )


def _lines(
    proc: subprocess.Popen[bytes], log: Path, prefixes: tuple[str, ...], deadline: float
) -> list[int]:
    """The ports after each prefix, once every one has been printed; RuntimeError naming the
    log if the node exits first or the deadline passes."""
    while True:
        found: dict[str, int] = {}
        for line in log.read_text(errors="replace").splitlines():
            for prefix in prefixes:
                if line.startswith(prefix):
                    found.setdefault(prefix, int(line[len(prefix) :]))
        if len(found) == len(prefixes):
            return [found[p] for p in prefixes]
        if proc.poll() is not None:
            raise RuntimeError(f"node exited with {proc.returncode} before it was ready; {log}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"node printed no {', '.join(prefixes)} in time; see {log}")
        time.sleep(0.05)
