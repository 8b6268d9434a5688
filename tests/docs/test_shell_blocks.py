"""The shell (and Python) blocks of README.md and docs/quickstart.md run as written against
the demo.

The demo here is `unitgate up --simulated` on the repository's own config.toml, copied with its
fixed ports (8080, 8081 and the units') moved to free ones; each block gets the same ports
substituted before it runs from the repository root: sh, bash and console blocks in bash
(`set -euo pipefail`), python blocks (the `openai` client's) in this interpreter. curl runs
with `--fail`, so an HTTP error fails its block. A block that cannot run here is preceded by the
visible marker `<!-- docs-test: skip (why) -->`; the skipped blocks are reported as skipped
tests, each with its reason, and any other block that fails fails the test.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from loadtest.bench.health.real import moved_ports

ROOT = Path(__file__).resolve().parents[2]
PAGES = ("README.md", "docs/quickstart.md")
RUNNABLE = ("sh", "bash", "console", "python")
FENCE = re.compile(r"^```(\S*)\s*$")
MARKER = re.compile(r"^<!--\s*docs-test:(.*?)-->\s*$")
SKIP = re.compile(r"^\s*skip \((.+)\)\s*$")
DEMO_PORT = re.compile(r"127\.0\.0\.1:(\d+)")
READY_WITHIN_S = 30.0
BLOCK_TIMEOUT_S = 20.0
MODEL = "SmolLM2-135M-Instruct"  # what the demo config serves
MARKER_FORM = "<!-- docs-test: skip (why) -->"


@dataclass(frozen=True)
class Block:
    page: str
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    skip: str | None  # the marker's reason

    @property
    def name(self) -> str:
        return f"{self.page}:{self.line}"

    def script(self) -> str:
        """What runs: a console block's `$ ` lines only (the rest is shown output)."""
        if self.lang != "console":
            return self.text
        return "\n".join(line[2:] for line in self.text.splitlines() if line.startswith("$ "))

    def argv(self, script: str) -> list[str]:
        if self.lang == "python":
            return [sys.executable, "-c", script]
        return ["bash", "-euo", "pipefail", "-c", script]


def blocks(page: str) -> list[Block]:
    """The page's fenced sh, bash, console and python blocks, each with its skip marker."""
    found: list[Block] = []
    lines = (ROOT / page).read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        if fence[1] in RUNNABLE:
            text = "\n".join(lines[i + 1 : end]) + "\n"
            found.append(Block(page, i + 1, fence[1], text, _marker(page, lines, i)))
        i = end + 1
    return found


def _marker(page: str, lines: list[str], fence: int) -> str | None:
    before = lines[fence - 1] if fence > 0 else ""
    marker = MARKER.match(before)
    if marker is None:
        return None
    skip = SKIP.match(marker[1])
    if skip is None:
        raise AssertionError(f"{page}:{fence}: malformed marker {before!r}; use {MARKER_FORM}")
    return skip[1]


ALL_BLOCKS = [b for page in PAGES for b in blocks(page)]


@dataclass(frozen=True)
class Demo:
    ports: dict[int, int]  # the demo config's port -> this run's

    def substitute(self, text: str) -> str:
        return DEMO_PORT.sub(lambda m: f"127.0.0.1:{self.ports.get(int(m[1]), int(m[1]))}", text)


def demo_config(tmp: Path) -> dict[int, int]:
    """config.toml with every 127.0.0.1 port and the listeners' `port =` moved to free ports."""
    text, ports = moved_ports((ROOT / "config.toml").read_text(encoding="utf-8"))
    (tmp / "config.toml").write_text(text, encoding="utf-8")
    return ports


def block_env(tmp: Path) -> dict[str, str]:
    """The venv's commands on PATH, curl failing on HTTP errors, no proxy for loopback, no
    admin token of the caller's (the demo config opens its admin API on loopback only when no
    token is set)."""
    (tmp / ".curlrc").write_text("fail\nshow-error\nmax-time = 15\n")
    env = {k: v for k, v in os.environ.items() if k != "UNITGATE_ADMIN_TOKEN"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["CURL_HOME"] = str(tmp)
    for name in ("no_proxy", "NO_PROXY"):  # the demo is local, whatever proxy the caller uses
        env[name] = ",".join(filter(None, ["127.0.0.1,localhost", env.get(name)]))
    return env


def wait_ready(proc: subprocess.Popen[bytes], url: str, log: Path) -> None:
    deadline = time.monotonic() + READY_WITHIN_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"unitgate up exited {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(url, timeout=1) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.1)
    raise AssertionError(f"not ready within {READY_WITHIN_S} s: {log.read_text()[-2000:]}")


def warm_up(url: str) -> None:
    """One answered request, as a reader following the page has sent before looking at metrics."""
    message = {"role": "user", "content": "hi"}
    body = json.dumps({"model": MODEL, "max_tokens": 4, "messages": [message]}).encode()
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.status == 200


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    tmp = tmp_path_factory.mktemp("demo")
    ports = demo_config(tmp)
    log = tmp / "up.log"
    up = ["up", "--simulated", "--config", "config.toml", "--log-dir", "logs"]  # logs: kept here
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gateway", *up],
            cwd=tmp,
            env=block_env(tmp),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its simulator too is in this group, stopped with it
        )
    try:
        public = f"http://127.0.0.1:{ports[8080]}"
        wait_ready(proc, public + "/readyz", log)
        warm_up(public + "/v1/chat/completions")
        yield Demo(ports)
    finally:
        _stop(proc)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # whatever of the group is left
    proc.wait()


@pytest.mark.slow  # the demo starts once for all blocks: about 9 s in all
@pytest.mark.parametrize("block", ALL_BLOCKS, ids=[b.name for b in ALL_BLOCKS])
def test_shell_block_runs_against_the_demo(
    block: Block, demo: Demo, tmp_path_factory: pytest.TempPathFactory
) -> None:
    if block.skip is not None:
        pytest.skip(f"{block.name} marked skip: {block.skip}")
    script = demo.substitute(block.script())
    done = subprocess.run(
        block.argv(script),
        cwd=ROOT,
        env=block_env(tmp_path_factory.mktemp("block")),
        capture_output=True,
        timeout=BLOCK_TIMEOUT_S,
    )
    assert done.returncode == 0, (
        f"{block.name} (not marked {MARKER_FORM}) failed with {done.returncode}:\n{script}\n"
        f"stdout: {done.stdout.decode(errors='replace')[-2000:]}\n"
        f"stderr: {done.stderr.decode(errors='replace')[-2000:]}"
    )


def test_the_pages_have_blocks_and_the_runnable_ones_are_most() -> None:
    for page in PAGES:
        found = blocks(page)
        assert any(b.skip is None for b in found), f"{page}: no runnable shell block"
        assert all(b.skip for b in found if "make run" in b.text), "make run must be marked"
        markers = [line for line in (ROOT / page).read_text().splitlines() if MARKER.match(line)]
        assert len(markers) == sum(1 for b in found if b.skip), (
            f"{page}: a docs-test marker that is not right above a runnable block"
        )


def test_a_marker_must_say_skip_and_why(tmp_path: Path) -> None:
    lines = ["text", "<!-- docs-test: skipp -->", "```sh", "true", "```"]
    with pytest.raises(AssertionError, match="malformed marker"):
        _marker("page.md", lines, 2)
    assert _marker("page.md", ["<!-- docs-test: skip (starts it) -->", "```sh"], 1) == "starts it"
    assert _marker("page.md", ["", "```sh"], 1) is None
