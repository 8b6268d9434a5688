"""A vLLM unit that cannot start is refused at once, in one line naming the bad key or value,
by `unitgate node` and by `unitgate up` (before any node starts). Needs vLLM (for its argument
names and checks) but starts no engine."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gateway.base.ports import free_port
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


def node(model: Path, vllm_args: str) -> subprocess.CompletedProcess[str]:
    return run(
        *("node", "--backend", "vllm", "--role", "leader", "--model", str(model)),
        *("--port", str(free_port()), "--vllm-args", vllm_args),
    )


def test_node_refuses_an_unknown_argument(tiny_model: Path) -> None:
    done = node(tiny_model, '{"dtyp": "float32"}')
    assert done.returncode == 2, done.stderr[-2000:]
    assert "unitgate node: --vllm-args: 'dtyp' is not a vLLM engine or server argument" in (
        done.stderr
    )


@pytest.mark.parametrize(
    ("vllm_args", "message"),
    [
        ('{"max_model_len": "long"}', "argument --max-model-len: invalid"),
        (
            '{"enable_auto_tool_choice": true, "tool_call_parser": "hermes2"}',
            "invalid tool call parser: hermes2",
        ),
    ],
)
def test_node_refuses_a_bad_serve_argument_before_starting_vllm(
    tiny_model: Path, vllm_args: str, message: str
) -> None:
    """vLLM's own parser and server checks, run by the node before any engine starts."""
    done = node(tiny_model, vllm_args)
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"unitgate node: --vllm-args: {message}" in done.stderr
    assert "EngineCore" not in done.stderr


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
    message = (
        "unitgate up: unit v0: engine_args: 'max_num_seq' is not a vLLM engine or server argument"
    )
    assert message in done.stderr
