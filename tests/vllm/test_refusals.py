"""A vLLM unit that cannot start is refused at once, in one line naming the bad key, by
`unitgate node` and by `unitgate up` (before any node starts). Needs vLLM (for its argument
names) but starts no engine."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from engine.up.ports import free_port
from tests.vllm.support import ROOT

pytestmark = [pytest.mark.vllm, pytest.mark.usefixtures("vllm_required")]


def run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


def test_node_refuses_an_unknown_engine_argument(tiny_model: Path) -> None:
    done = run(
        *("node", "--backend", "vllm", "--role", "leader", "--model", str(tiny_model)),
        *("--port", str(free_port()), "--vllm-args", '{"dtyp": "float32"}'),
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert "unitgate node: --vllm-args: 'dtyp' is not a vLLM engine argument" in done.stderr


def test_up_refuses_a_vllm_unit_with_an_unknown_engine_argument(
    tmp_path: Path, tiny_model: Path
) -> None:
    leader, *nodes = [f"http://127.0.0.1:{free_port()}" for _ in range(3)]
    quoted = ", ".join(f'"{n}"' for n in nodes)
    (tmp_path / "config.toml").write_text(
        '[gateway]\nport = 0\nmodels = ["tiny"]\n[metrics]\nport = 0\n[admin]\nenabled = false\n'
        f'[[units]]\nid = "v0"\nleader = "{leader}"\nnodes = [{quoted}]\nbackend = "vllm"\n'
        f'model = "{tiny_model}"\nengine_args = {{ dtype = "float32", max_num_seq = 4 }}\n'
    )
    done = run("up", "--config", str(tmp_path / "config.toml"), cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-2000:]
    message = "unitgate up: unit v0: engine_args: 'max_num_seq' is not a vLLM engine argument"
    assert message in done.stderr
