"""Detection on `make run`'s own units: u0's follower frozen or killed while streams run.

The simulated part (detect.py) measures the detector alone. This part measures it where users
meet it: `unitgate up` with the project's config.toml (real SmolLM2 gangs of two nodes on the
builtin engine, ports moved to free ones), four clients looping short streamed chats through
the gateway, and u0's follower frozen (SIGSTOP, then SIGCONT) or killed (SIGKILL; `up`
restarts the whole unit) `trials` times each. Each run's time from the signal to the scrape
that first shows u0 not routable is reported, with the reason the gateway logged for it.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from random import Random
from typing import Any

import orjson

from gateway.base.ports import free_port
from loadtest.bench.health.detect import Seen, Watch
from loadtest.bench.health.observe import spread
from loadtest.bench.processes import stop_child

UP_WITHIN_S = 240.0  # two SmolLM2 units on a busy 2-core machine
FAULT_WITHIN_S = 5.0  # well past the 1 s aim: a miss is measured, not timed out
BACK_WITHIN_S = 120.0  # a killed follower's unit is restarted whole: the model loads again
CLIENTS = 4
MAX_TOKENS = 8  # short streams: a unit is rarely idle, and rarely without a stream in flight
MODEL = "SmolLM2-135M-Instruct"
# What took u0 out: its prober's verdict, or its breaker (streams reset by the fault).
REASON = re.compile(r"unit u0: (unhealthy|breaker \w+) \((.*)\) by (\w+)")


@dataclass
class Run:
    fault: str  # "freeze" or "kill"
    at_s: float
    lower_s: float
    reason: str


@dataclass
class RealTrials:
    runs: list[Run] = field(default_factory=list)
    streams_completed: int = 0
    config: str = ""
    seconds: float = 0.0

    def times(self, fault: str) -> list[float]:
        return [r.at_s for r in self.runs if r.fault == fault]

    def summary(self) -> dict[str, dict[str, float]]:
        return {fault: spread(self.times(fault)) for fault in ("freeze", "kill")}

    def to_json(self) -> dict[str, Any]:
        return asdict(self) | {"summary": self.summary()}


def moved_ports(text: str) -> tuple[str, dict[int, int]]:
    """config.toml with every 127.0.0.1 port and the listeners' `port =` moved to a free one
    (the same port to the same), and the ports moved (old -> new)."""
    mapping: dict[int, int] = {}

    def move(match: re.Match[str]) -> str:
        old = int(match.group(2))
        if old not in mapping:
            mapping[old] = free_port()
        return f"{match.group(1)}{mapping[old]}"

    text = re.sub(r"(127\.0\.0\.1:)(\d+)", move, text)
    return re.sub(r"(?m)^(port = )(\d+)", move, text), mapping


def pid_listening(port: int) -> int:
    out = subprocess.run(
        ["ss", "-ltnpH", f"sport = :{port}"], capture_output=True, text=True, check=True
    ).stdout
    found = re.search(r"pid=(\d+)", out)
    if found is None:
        raise RuntimeError(f"no process listens on port {port}")
    return int(found.group(1))


class Clients:
    """Short streamed chats in a loop, CLIENTS at a time, until stopped."""

    def __init__(self, url: str) -> None:
        self.url, self.completed = url, 0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._loop, daemon=True) for _ in range(CLIENTS)]

    def __enter__(self) -> Clients:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30.0)

    def _loop(self) -> None:
        body = orjson.dumps(
            {
                "model": MODEL,
                "messages": [{"role": "user", "content": "Say hello."}],
                "max_tokens": MAX_TOKENS,
                "stream": True,
            }
        )
        headers = {"Content-Type": "application/json"}
        while not self._stop.is_set():
            request = urllib.request.Request(self.url + "/v1/chat/completions", body, headers)
            try:
                with urllib.request.urlopen(request, timeout=30.0) as answer:
                    answer.read()
                self.completed += 1
            except OSError:
                self._stop.wait(0.05)


@contextlib.contextmanager
def up(tmp: Path, config: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """`unitgate up` on `config`, until it prints that it is ready; its log file."""
    log = tmp / "up.log"
    argv = [sys.executable, "-m", "gateway", "up", "--config", str(config)]
    argv += ["--log-dir", str(tmp / "nodes")]
    with log.open("wb") as sink:
        proc = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + UP_WITHIN_S
        while b"unitgate up ready" not in log.read_bytes():
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = log.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"unitgate up was not ready within {UP_WITHIN_S:g} s:\n{tail}")
            time.sleep(0.2)
        yield proc, log
    finally:
        stop_child(proc)


def _ports(config_text: str) -> tuple[str, str, int]:
    """The gateway's URL, its metrics URL and u0's follower's port, from the moved config."""
    gateway, metrics = re.findall(r"(?m)^port = (\d+)", config_text)[:2]
    u0 = config_text[config_text.index('id = "u0"') :]
    nodes = re.search(r"nodes = \[([^\]]*)\]", u0)
    assert nodes is not None
    follower = int(re.findall(r":(\d+)", nodes.group(1))[1])
    return f"http://127.0.0.1:{gateway}", f"http://127.0.0.1:{metrics}", follower


FAULTS = ("freeze", "kill")


def run(
    tmp: Path,
    trials: int,
    seed: int,
    faults: tuple[str, ...] = FAULTS,
    source: Path = Path("config.toml"),
) -> RealTrials:
    """`trials` runs of each fault. A kill makes `up` restart u0 whole, after a delay that
    doubles with each restart up to 30 s (gateway/launcher/up/backoff.py): kills take the
    most time."""
    text, _ = moved_ports(source.read_text())
    config = tmp / "config.toml"
    config.write_text(text)
    url, metrics, follower_port = _ports(text)
    out = RealTrials(config=str(source))
    rng = Random(seed)
    started = time.monotonic()
    with up(tmp, config) as (proc, log), Clients(url) as clients:
        watch = Watch(metrics, [proc.pid])
        watch.until(True, time.monotonic(), BACK_WITHIN_S)
        for fault in faults:
            for _ in range(trials):
                time.sleep(1.0 + rng.uniform(0.0, 0.25))  # streams running, a random phase
                out.runs.append(_trial(watch, log, follower_port, fault))
                print(f"  {fault}: {out.runs[-1].at_s:.2f} s ({out.runs[-1].reason})", flush=True)
        out.streams_completed = clients.completed
    out.seconds = time.monotonic() - started
    return out


def _trial(watch: Watch, log: Path, port: int, fault: str) -> Run:
    pid = pid_listening(port)
    logged = len(log.read_bytes())
    signal_at = time.monotonic()
    os.kill(pid, signal.SIGSTOP if fault == "freeze" else signal.SIGKILL)
    try:
        seen: Seen = watch.until(False, signal_at, FAULT_WITHIN_S)
    finally:
        if fault == "freeze":
            os.kill(pid, signal.SIGCONT)
    reasons = REASON.findall(log.read_bytes()[logged:].decode(errors="replace"))
    watch.until(True, time.monotonic(), BACK_WITHIN_S)
    reason = f"{reasons[0][2]}: {reasons[0][1]}" if reasons else "?"
    return Run(fault, seen.at_s, seen.lower_s, reason)
