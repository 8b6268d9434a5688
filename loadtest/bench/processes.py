"""What every benchmark does with its processes: start them pinned, read their CPU, stop them.

Shared by the benchmarks in loadtest/bench/. A simulator, gateway or relay is a `python -m`
child that reports its address through a ready file (`child`), so the OS picks free ports and
the harness never races a process that is still binding; `gateway_toml` is the benchmark
gateway's config over simulated units.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.base.readyfile import wait_ready_blocking
from loadtest.readyfile import wait_http_ok

MODEL = "unitgate-sim"  # the model id the simulated units serve (loadtest.simunits)
READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0
CLK_TCK = os.sysconf("SC_CLK_TCK")
GATEWAY_TOML = """\
[gateway]
port = 0
models = ["{model}"]
workers = {workers}
[metrics]
port = 0
[routing]
affinity = "none"
[admission]
unit_max_inflight = {cap}
queue_size = {queue}
[upstream]
max_connections = 0
relay = "{relay}"
[resume]
enabled = {resume}
"""
NO_ADMIN = "[admin]\nenabled = false\n"


def gateway_toml(
    units: list[dict[str, Any]],
    *,
    cap: int = 4096,
    queue: int = 1024,
    resume: bool = True,
    admin: str = NO_ADMIN,
    workers: int = 1,
    state: str = "",
    relay: str = "auto",
) -> str:
    """A benchmark gateway's config: simulated units by their ready-file entries, affinity
    off, an unbounded upstream pool, per-unit caps past what the load needs (`cap`),
    `workers` processes on its port; `admin` and `state` are those tables as TOML; `relay`
    is `[upstream] relay` (the native one unless it cannot be built)."""
    head = GATEWAY_TOML.format(
        model=MODEL,
        cap=cap,
        queue=queue,
        resume=str(resume).lower(),
        workers=workers,
        relay=relay,
    )
    tables = "".join(
        f'[[units]]\nid = "{u["id"]}"\nleader = "{u["leader"]}"\nnodes = {json.dumps(u["nodes"])}\n'
        for u in units
    )
    return head + admin + state + tables


@dataclass(frozen=True)
class Pins:
    """The relays share a core of their own, so the CPU time they are charged is their own."""

    load: int
    relay: int


def pin_cpus() -> Pins | None:
    cpus = sorted(os.sched_getaffinity(0))
    return Pins(load=cpus[0], relay=cpus[1]) if len(cpus) >= 2 else None


def cpu_times(pid: int) -> tuple[int, int]:
    """utime and stime (clock ticks) of all threads; fields counted after the ')' since comm
    may hold spaces."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]), int(fields[12])


def cpu_ticks(pid: int) -> int:
    """utime + stime of all threads."""
    return sum(cpu_times(pid))


def tree(pid: int) -> list[int]:
    """A process and its live descendants (a control plane and its workers)."""
    pids = [pid]
    with contextlib.suppress(FileNotFoundError):
        for child_pid in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
            pids += tree(int(child_pid))
    return pids


def tree_ticks(pid: int) -> int:
    """`cpu_ticks` of a process and of its live descendants."""
    total = 0
    for each in tree(pid):
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            total += cpu_ticks(each)
    return total


@contextlib.contextmanager
def pinned(cpu: int | None) -> Iterator[None]:
    """Children inherit affinity at fork, so pinning the parent around Popen pins every thread."""
    if cpu is None:
        yield
        return
    saved = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})
    try:
        yield
    finally:
        os.sched_setaffinity(0, saved)


def stop_child(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL after STOP_TIMEOUT_S: every benchmark child ends this way."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def child(
    argv: list[str],
    ready: Path,
    cpu: int | None,
    what: str,
    routes: bool = False,
    cwd: Path | None = None,
) -> Iterator[dict[str, Any]]:
    """`python -m *argv` pinned to `cpu`, yielding its ready file's entries; stopped on exit.
    Stdout is dropped (ready banners would break the table); stderr stays visible.
    `routes`: a gateway, ready once its /readyz says it can route, not merely listening.
    `cwd`: where it runs, and so which source tree's packages it imports first."""
    with pinned(cpu):
        proc = subprocess.Popen([sys.executable, "-m", *argv], stdout=subprocess.DEVNULL, cwd=cwd)
    try:
        info = wait_ready_blocking(ready, proc, READY_TIMEOUT_S, what)
        if routes:
            wait_http_ok(info["public"] + "/readyz", proc, READY_TIMEOUT_S, what)
        yield info
    finally:
        stop_child(proc)
