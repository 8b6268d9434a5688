"""docs/fronting.md's walk-through, run as written: its commands export the model, start a
stock `vllm serve`, write the page's config, start the gateway in front of it and talk to it.

Only the ports move (the page's 8000 and 8080 to free ones; the operator listener's, which
the page leaves at its default, by an environment override), and everything runs in a
temporary directory with this venv's commands (python, vllm, unitgate) first on PATH.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.base.ports import free_port

pytestmark = [
    pytest.mark.slow,
    pytest.mark.vllm,
    pytest.mark.timeout(600),
    pytest.mark.usefixtures("vllm_required"),
]
PAGE = Path(__file__).resolve().parents[2] / "docs" / "fronting.md"
SECTION = "## Walk-through"
FENCE = re.compile(r"^```(\w*)\s*$")
SAVED_AS = re.compile(r"as `([\w.-]+\.toml)`")
PORTS = re.compile(r"(127\.0\.0\.1:|--port )(8000|8080)\b")
RUN_S = 480


def walk_through() -> tuple[str, tuple[str, str]]:
    """The section's shell blocks as one script, and its config block (file name, text)."""
    lines = PAGE.read_text(encoding="utf-8").split("\n")
    start = next(i for i, line in enumerate(lines) if line.startswith(SECTION))
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("## "))
    script: list[str] = []
    config: tuple[str, str] | None = None
    i = start
    while i < end:
        fence = FENCE.match(lines[i])
        if fence is None:
            i += 1
            continue
        close = next(j for j in range(i + 1, end) if lines[j].startswith("```"))
        text = "\n".join(lines[i + 1 : close])
        if fence[1] == "sh":
            script.append(text)
        elif fence[1] == "toml":
            named = SAVED_AS.search(" ".join(lines[max(start, i - 3) : i]))
            assert named is not None, f"{PAGE}:{i + 1}: a config block without its file name"
            config = (named[1], text)
        i = close + 1
    assert script and config is not None, f"{PAGE}: no walk-through found"
    return "\n".join(script) + "\n", config


def test_the_walk_through_runs_as_written(tmp_path: Path) -> None:
    script, (name, config) = walk_through()
    ports = {"8000": str(free_port()), "8080": str(free_port())}

    def moved(text: str) -> str:
        return PORTS.sub(lambda m: m[1] + ports[m[2]], text)

    (tmp_path / name).write_text(moved(config), encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k != "UNITGATE_ADMIN_TOKEN"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["UNITGATE__GATEWAY__PORT"] = ports["8080"]
    env["UNITGATE__METRICS__PORT"] = str(free_port())
    env["no_proxy"] = env["NO_PROXY"] = "127.0.0.1,localhost"
    proc = subprocess.Popen(
        ["bash", "-euo", "pipefail", "-c", moved(script)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # the background servers too: one killpg ends them all
    )
    try:
        out, _ = proc.communicate(timeout=RUN_S)
    finally:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                continue
    text = out.decode(errors="replace")
    logs = "".join(
        f"\n--- {log.name} ---\n{log.read_text(errors='replace')[-3000:]}"
        for log in sorted(tmp_path.glob("*.log"))
    )
    assert proc.returncode == 0, f"the walk-through failed ({proc.returncode}):\n{text}{logs}"
    import vllm

    for said in (
        '"id":"SmolLM2-135M-Instruct"',  # /v1/models: the public id, the unit's own card
        '"max_model_len":2048',
        '"object":"chat.completion"',
        '"tokens":[',
        f'"version":"{vllm.__version__}"',
        '"object":"response"',
    ):
        assert said in text.replace(" ", ""), f"{said!r} not in the output:\n{text}"
