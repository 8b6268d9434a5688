"""Helpers for the `unitgate node` / `unitgate up` process tests: spawn `python -m gateway`,
read what it prints, talk to it with the openai client, and leave no process behind.

(Helpers only; named test_up_* to live beside the tests it serves.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from openai import OpenAI

from tests.engine.test_runtime_support import ROOT, get_health

MODEL = "unitgate-sim"


@dataclass
class Proc:
    proc: subprocess.Popen[bytes]
    out: Path

    def text(self) -> str:
        return self.out.read_text(errors="replace")

    def tail(self) -> str:
        """What a failure message shows of the output."""
        return self.text()[-3000:]

    def wait_line(self, prefix: str, within: float) -> str:
        """The rest of the first output line starting with `prefix`."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            for line in self.text().splitlines():
                if line.startswith(prefix):
                    return line[len(prefix) :].strip()
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"{self.out.name} exited {self.proc.returncode}:\n{self.tail()}"
                )
            time.sleep(0.1)
        raise AssertionError(
            f"no {prefix!r} line in {within} s from {self.out.name}:\n{self.tail()}"
        )

    def stop(self, sig: int = signal.SIGKILL) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(15)


def unitgate(tmp: Path, name: str, *args: str, env: dict[str, str] | None = None) -> Proc:
    out = tmp / f"{name}.out"
    with out.open("wb") as f:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gateway", *args],
            stdout=f,
            stderr=subprocess.STDOUT,
            env={**(env or os.environ), "PYTHONPATH": str(ROOT)},
            cwd=tmp,
        )
    return Proc(proc, out)


def stream_chat(base_url: str, model: str = MODEL, priority: str | None = None) -> str:
    """A streamed chat completion through the official client; the whole text. Seeded: the
    tiny model's weights are random, and an unseeded answer of 8 tokens is all ids without
    text (its vocabulary's padding) about once in 300 runs; this seed's answer has text.
    `priority`: the gateway's class to ask for (x-unitgate-priority)."""
    client = OpenAI(base_url=f"{base_url}/v1", api_key="unused", timeout=30, max_retries=0)
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "hello, unit"}],
        stream=True,
        max_tokens=8,
        seed=1,
        extra_body={"ignore_eos": True},
        extra_headers={"x-unitgate-priority": priority} if priority else None,
    )
    chunks = list(stream)
    assert chunks[-1].choices[0].finish_reason == "length", chunks[-1]
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def health(url: str) -> dict[str, Any]:
    port = int(url.rsplit(":", 1)[1])
    status, body = get_health(port)
    assert status == 200, body
    return body


def eventually(check: Callable[[], Any], within: float, what: str) -> Any:
    """Poll `check` until it returns a truthy value without raising, or fail at the deadline."""
    deadline = time.monotonic() + within
    last: object = None
    while time.monotonic() < deadline:
        try:
            result = check()
            if result:
                return result
        except Exception as exc:  # keep polling; report the last failure
            last = exc
        time.sleep(0.2)
    raise AssertionError(f"{what} not within {within} s (last: {last!r})")


def pid_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False
