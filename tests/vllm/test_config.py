"""The vLLM backend's wiring without vLLM running: config units, `unitgate up`'s node flags,
the engine arguments built from them, the tiny checkpoint, and the missing-vLLM error.

Fast, and runs in either venv (nothing here imports vLLM)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from engine.backends.vllm.args import engine_kwargs
from engine.backends.vllm.serve_args import argv
from engine.flags import build_parser
from engine.model import ModelConfig
from engine.model.tokenizer import HFTokenizer
from engine.settings import NodeSettings
from gateway.config import ConfigError, config_from_dict
from gateway.launcher.up.plan import EngineOptions, PlanError, plan_units
from tests.vllm.support import ROOT


def vllm_unit(**extra: Any) -> dict[str, Any]:
    """The leader's /health on a port of its own (8100), beside its API (8101)."""
    urls = ["http://127.0.0.1:8100", "http://127.0.0.1:8102"]
    return {
        "id": "v0",
        "leader": "http://127.0.0.1:8101",
        "nodes": urls,
        "backend": "vllm",
        **extra,
    }


def load(*units: dict[str, Any]) -> Any:
    return config_from_dict({"gateway": {"models": ["tiny"]}, "units": list(units)})


def test_a_vllm_unit_becomes_vllm_nodes_with_its_model_and_engine_args() -> None:
    config = load(vllm_unit(model="/models/tiny", engine_args={"dtype": "float32"}))
    leader, follower = plan_units(config).units[0].nodes
    argv = follower.argv("127.0.0.1:29500", EngineOptions())
    assert argv[argv.index("--backend") + 1] == "vllm"
    assert argv[argv.index("--model") + 1] == "/models/tiny"
    assert json.loads(argv[argv.index("--vllm-args") + 1]) == {"dtype": "float32"}
    argv = leader.argv("127.0.0.1:29500", EngineOptions())
    assert "--served-model-name" in argv and argv[argv.index("--backend") + 1] == "vllm"
    ns = build_parser().parse_args(argv)
    assert (ns.port, ns.health_host, ns.health_port) == (8101, "127.0.0.1", 8100)


def test_builtin_units_keep_their_flags() -> None:
    urls = ["http://127.0.0.1:8101"]
    config = load({"id": "b0", "leader": urls[0], "nodes": urls})
    argv = plan_units(config).units[0].leader.argv("127.0.0.1:1", EngineOptions())
    assert "--backend" not in argv and argv[argv.index("--model") + 1] == "tiny"


@pytest.mark.parametrize(
    ("unit", "message"),
    [
        (vllm_unit(backend="vllm2", model="/m"), "[units][0].backend must be one of"),
        (vllm_unit(), '[units][0].model is required with "vllm"'),
        (vllm_unit(backend="builtin", engine_args={"dtype": "x"}), "[units][0].engine_args only"),
        (vllm_unit(model="/m", engine_args=3), "[units][0].engine_args must be a table"),
    ],
)
def test_bad_backend_settings_name_the_key(unit: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load(unit)
    assert message in str(err.value)


def test_engine_args_unitgate_sets_itself_are_refused_with_the_unit_and_key() -> None:
    config = load(vllm_unit(model="/m", engine_args={"nnodes": 4}))
    with pytest.raises(PlanError, match=r"unit v0: engine_args: 'nnodes' is set by unitgate"):
        plan_units(config)


def node_args(*flags: str) -> NodeSettings:
    args = build_parser().parse_args(["--backend", "vllm", "--model", "/m", *flags])
    return NodeSettings.from_flags(args)


def test_node_flags_map_to_vllm_multi_node_engine_args() -> None:
    args = node_args(
        *("--role", "follower", "--rank", "1", "--world-size", "2"),
        *("--master", "127.0.0.1:29555", "--max-seq-len", "512"),
        *("--vllm-args", '{"dtype": "float32", "enforce_eager": false}'),
    )
    kwargs = engine_kwargs(args)
    assert kwargs["tensor_parallel_size"] == 2 and kwargs["distributed_executor_backend"] == "mp"
    assert (kwargs["nnodes"], kwargs["node_rank"]) == (2, 1)
    assert (kwargs["master_addr"], kwargs["master_port"]) == ("127.0.0.1", 29555)
    assert kwargs["max_model_len"] == 512 and kwargs["dtype"] == "float32"
    assert kwargs["enforce_eager"] is False  # the unit's own engine args win over defaults


def test_a_single_node_sets_no_multi_node_args() -> None:
    kwargs = engine_kwargs(node_args("--role", "leader", "--served-model-name", "tiny"))
    assert "nnodes" not in kwargs and kwargs["served_model_name"] == "tiny"
    assert kwargs["tensor_parallel_size"] == 1 and kwargs["enforce_eager"] is True


def test_server_arguments_pass_through_and_the_model_id_defaults_to_the_folder() -> None:
    server = {"tool_call_parser": "hermes", "enable_auto_tool_choice": True, "api_key": "k"}
    kwargs = engine_kwargs(node_args("--role", "leader", "--vllm-args", json.dumps(server)))
    assert server.items() <= kwargs.items()
    assert kwargs["served_model_name"] == "m"  # --model /m


@pytest.mark.parametrize(
    ("vllm_args", "message"),
    [
        ("[1]", "expected a JSON object"),
        ("{", "not valid JSON"),
        ('{"node_rank": 1}', "--rank"),
        ('{"port": 9000}', "'port' is set by unitgate .from --port"),
    ],
)
def test_bad_vllm_args_are_refused(vllm_args: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        engine_kwargs(node_args("--role", "leader", "--vllm-args", vllm_args))


def test_without_vllm_the_node_says_what_to_install(tmp_path: Path) -> None:
    """`sys.modules['vllm'] = None` hides an installed vLLM, so this runs in both venvs."""
    code = (
        "import sys; sys.modules['vllm'] = None; from engine.cli import main; "
        f"sys.exit(main(['--backend', 'vllm', '--role', 'leader', '--model', {str(tmp_path)!r}]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert lines == [
        "unitgate node: --backend vllm: vLLM is not installed; "
        "install it with pip install 'unitgate[vllm]'"
    ]


def test_the_tiny_checkpoint_loads_as_a_llama_folder(tiny_model: Path) -> None:
    config = ModelConfig.from_hf(tiny_model)
    assert config.num_heads % 2 == 0 and config.num_kv_heads % 2 == 0  # splits over TP=2
    assert config.head_dim == 64
    tokenizer = HFTokenizer(tiny_model)
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "hello, unit"}])
    assert tokenizer.decode(ids) == "user\nhello, unit\nassistant\n"
    assert tokenizer.stop_ids == {tokenizer.eos_id}
    params = sum(int(np) for np in _param_counts(tiny_model))
    assert 200_000 < params < 1_000_000


def _param_counts(folder: Path) -> list[int]:
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        return [f.get_tensor(name).numel() for name in f.keys()]  # noqa: SIM118


def test_serve_arguments_become_the_words_vllm_serve_would_get() -> None:
    """By each option's kind, as vLLM declares it (a stand-in parser with the same kinds)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--enforce-eager", action=argparse.BooleanOptionalAction)
    parser.add_argument("--disable-log-stats", action="store_true")
    parser.add_argument("--api-key", nargs="+")
    parser.add_argument("--middleware", action="append")
    parser.add_argument("--structured-outputs-config", type=json.loads)
    parser.add_argument("--chat-template")
    kwargs = {
        "enforce_eager": False,
        "disable_log_stats": True,
        "api_key": "k",
        "middleware": ["a.b", "c.d"],
        "structured_outputs_config": {"backend": "xgrammar"},
        "chat_template": "-{{ x }}",
    }
    words = argv(parser, kwargs)
    assert words == [
        *("--no-enforce-eager", "--disable-log-stats", "--api-key", "k"),
        *("--middleware", "a.b", "--middleware", "c.d"),
        '--structured-outputs-config={"backend": "xgrammar"}',
        "--chat-template=-{{ x }}",
    ]
    parsed = parser.parse_args(words)
    assert parsed.structured_outputs_config == {"backend": "xgrammar"}
    assert parsed.chat_template == "-{{ x }}" and parsed.api_key == ["k"]
    with pytest.raises(ValueError, match="'enforce_eagr' is not a vLLM engine or server"):
        argv(parser, {"enforce_eagr": True})
