"""The first example of docs/load-testing.md runs as written against what `make run` starts,
and passes.

`make run` is `unitgate up --config config.toml`: a gateway before two units of the real
SmolLM2 on CPU, two nodes each. That starts here from the repository's own config.toml with
its fixed ports moved to free ones (as the shell-block tests move them), and the example,
taken from the page so the two cannot drift apart, runs in bash against it with the same
ports substituted. Cost: about 9 s to start and stop, and the example's own run.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.docs.test_shell_blocks import Demo, block_env, demo_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "load-testing.md"
SECTION = "## Against `make run`"
READY_LINE = "unitgate up ready "
READY_WITHIN_S = 120.0  # four nodes load the model's GGUF, and the kernels may compile first
GRACE_S = 30.0  # the default --grace the example relies on


def example() -> str:
    """The first sh block of the page's section on `make run`, continuation lines joined."""
    text = PAGE.read_text(encoding="utf-8")
    section = text[text.index(SECTION) :]
    block = re.search(r"^```sh\n(.*?)^```", section, re.MULTILINE | re.DOTALL)
    assert block is not None, f"{PAGE}: no sh block under {SECTION!r}"
    return block[1].replace("\\\n", " ").strip()


@dataclass
class Up:
    demo: Demo
    tmp: Path


def _wait_ready(proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + READY_WITHIN_S
    while READY_LINE not in log.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"unitgate up not ready: {log.read_text()[-3000:]}")
        time.sleep(0.2)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Ctrl-C, as `make run` is stopped; then whatever of its group is left, killed."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(30)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    tmp = tmp_path_factory.mktemp("make-run")
    demo = Demo(demo_config(tmp))
    log = tmp / "up.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gateway", "up", "--config", "config.toml"],
            cwd=tmp,
            env=block_env(tmp),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its nodes too are in this group, stopped with it
        )
    try:
        _wait_ready(proc, log)
        yield Up(demo, tmp)
    finally:
        _stop(proc)


def test_the_example_is_a_short_run_against_the_demo() -> None:
    argv = shlex.split(example())
    assert argv[:4] == ["unitgate", "loadtest", "--url", "http://127.0.0.1:8080"], argv
    duration = float(argv[argv.index("--duration") + 1])
    assert duration <= 5 and int(argv[argv.index("--max-tokens") + 1]) <= 16, argv


def test_the_example_passes_against_make_run(up: Up) -> None:
    script = up.demo.substitute(example())
    argv = shlex.split(script)
    duration = float(argv[argv.index("--duration") + 1])
    started = time.monotonic()
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=up.tmp,
        env=block_env(up.tmp),
        capture_output=True,
        text=True,
        timeout=duration + GRACE_S + 30,
    )
    took = time.monotonic() - started
    assert done.returncode == 0, f"{script}\n{done.stdout}\n{done.stderr}"
    out = done.stdout
    ran = re.search(r"^requests (\d+)  succeeded (\d+)  failed 0  wall ([\d.]+) s$", out, re.M)
    assert ran is not None and int(ran[1]) == int(ran[2]) >= 4, out
    grace = re.search(
        rf"^grace: \d+ requests? ended within the {GRACE_S:g} s --grace after --duration "
        rf"{duration:g} s, counted above; 0 cut$",
        out,
        re.MULTILINE,
    )
    assert grace is not None, out
    assert "errors: none" in out and "checks: all passed" in out, out
    assert float(ran[3]) < duration + GRACE_S and took < duration + GRACE_S + 15, (ran[3], took)
