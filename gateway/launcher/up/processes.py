"""One node process of a local unit, and stopping a unit's processes in order; starting and
stopping any child of `unitgate up`.

Children run in their own session: a Ctrl-C in the terminal reaches `unitgate up` alone, which
then stops them in order (gateways, then units, leaders first, then redis-server) instead of
everything dying at once. On Linux each child also gets SIGKILL if `unitgate up` itself dies,
so a crash of the parent leaves no orphans holding the run's ports.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gateway.launcher.up.plan import EngineOptions, NodeSpec

PR_SET_PDEATHSIG = 1


@dataclass(slots=True)
class NodeProcess:
    spec: NodeSpec
    proc: asyncio.subprocess.Process

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc.returncode is None

    def signal(self, sig: int) -> None:
        if self.alive:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(sig)

    def group_alive(self) -> bool:
        """Is anything left in the node's process group (it runs in its own session)?"""
        try:
            os.killpg(self.pid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    async def reap_group(self, within: float) -> None:
        """A node's own children (vLLM's engine core and workers) would outlive a node that
        was killed before it could stop them; what is still in its group after `within`
        seconds (time for helpers that exit by themselves once the node is gone) is killed."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        for _ in range(int(within / 0.1) + 1):  # nothing signals "group empty": poll it
            if not self.group_alive() or loop.time() >= deadline:
                break
            await asyncio.sleep(0.1)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)


@dataclass(frozen=True, slots=True)
class Launcher:
    """Starts `unitgate node` processes; each node appends to its own log file."""

    options: EngineOptions
    log_dir: Path
    env: Mapping[str, str]

    async def start(self, spec: NodeSpec, master: str) -> NodeProcess:
        log_path = self.log_dir / f"{spec.unit}-rank{spec.rank}.log"
        argv = (sys.executable, "-m", "engine", *spec.argv(master, self.options))
        return NodeProcess(spec, await spawn(argv, log_path, self.env))


async def spawn(
    argv: Sequence[str], log_path: Path, env: Mapping[str, str]
) -> asyncio.subprocess.Process:
    """A child of `unitgate up` (a node, a gateway replica, redis-server, the simulator): in
    its own session, so the terminal's Ctrl-C reaches `up` alone and `up` stops its children
    in order; killed if `up` dies; its output appended to `log_path`."""
    with log_path.open("ab") as log:
        return await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=log,
            stderr=asyncio.subprocess.STDOUT,
            env=dict(env),
            start_new_session=True,
            preexec_fn=die_with_parent(),
        )


async def terminate(proc: asyncio.subprocess.Process, grace: float) -> None:
    """SIGTERM, and SIGKILL if it still runs after `grace` seconds; returns once it exited."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), grace)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
    await proc.wait()


def die_with_parent() -> Callable[[], None] | None:
    """prctl(PR_SET_PDEATHSIG, SIGKILL) in the child; libc is resolved here, before the fork."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def arm() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)

    return arm


async def wait_exited(nodes: Sequence[NodeProcess], within: float) -> bool:
    """True when every node has exited within `within` seconds."""
    waits = [asyncio.ensure_future(n.proc.wait()) for n in nodes if n.alive]
    if not waits:
        return True
    _, pending = await asyncio.wait(waits, timeout=within)
    for task in pending:
        task.cancel()
    return not pending


async def stop_nodes(nodes: Sequence[NodeProcess], grace: float) -> None:
    """Leader first: its SIGTERM stops the API and broadcasts STOP, so healthy followers exit
    0 on their own. Followers still there get SIGTERM, and anything left after `grace` dies."""
    leaders = [n for n in nodes if n.spec.rank == 0]
    followers = [n for n in nodes if n.spec.rank != 0]
    for node in leaders:
        node.signal(signal.SIGTERM)
    await wait_exited(leaders, grace)
    await wait_exited(followers, min(grace, 2.0))
    for node in followers:
        node.signal(signal.SIGTERM)
    if not await wait_exited(nodes, grace):
        for node in nodes:
            node.signal(signal.SIGKILL)
        await wait_exited(nodes, grace)
    await asyncio.gather(*(node.reap_group(min(grace, 2.0)) for node in nodes))


def log_tail(path: Path, lines: int = 5) -> str:
    """A child's last log lines, indented, for the message that says it failed ("" if none)."""
    try:
        last = path.read_text(errors="replace").splitlines()[-lines:]
    except FileNotFoundError:
        return ""
    return "".join(f"\n    {line}" for line in last)


def describe_exit(code: int | None) -> str:
    if code is not None and code < 0:
        with contextlib.suppress(ValueError):
            return f"{code} ({signal.Signals(-code).name})"
    return str(code)


def node_env(environ: Mapping[str, str], secret_names: Sequence[str]) -> dict[str, str]:
    """The nodes' environment: ours minus secrets they have no use for (the admin token)."""
    return {k: v for k, v in environ.items() if k not in secret_names} | {"PYTHONUNBUFFERED": "1"}
