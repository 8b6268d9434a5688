"""Backends by name and the settings they get: the registry imports a backend only when it is
chosen (and choosing vLLM's does not import vLLM), and settings are one frozen, checked value."""

from __future__ import annotations

import dataclasses
import sys

import pytest

from engine.backends.registry import BACKENDS, lookup
from engine.backends.vllm.args import check_keys
from engine.flags import parse
from engine.scheduler import DEFAULT_PREFILL_CHUNK
from engine.settings import NodeSettings


def test_each_backend_is_its_modules_run_node() -> None:
    from engine.backends.builtin.node import run_node

    assert lookup("builtin") is run_node
    assert set(BACKENDS) == {"builtin", "vllm"}


def test_choosing_vllm_does_not_import_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)  # any `import vllm` would now fail
    assert callable(lookup("vllm"))


def test_an_unknown_backend_is_refused_by_flag() -> None:
    with pytest.raises(ValueError, match="--backend: expected one of builtin, vllm, got 'x'"):
        lookup("x")


def test_settings_are_frozen_and_their_defaults_are_the_flags() -> None:
    settings = parse(["--role", "leader"])
    assert settings == NodeSettings(role="leader")
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.port = 1  # type: ignore[misc]


def test_settings_built_directly_are_checked_too() -> None:
    with pytest.raises(ValueError, match="--num-slots: must be >= 1, got 0"):
        NodeSettings(role="leader", num_slots=0)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--dtype", "fp16"], "--dtype: expected one of float32, float16, bfloat16, got 'fp16'"),
        (["--weight-dtype", "int8"], "--weight-dtype: expected one of float32, float16"),
        (
            ["--weight-dtype", "float16", "--backend", "vllm", "--model", "/m"],
            "--weight-dtype: only applies to --backend builtin",
        ),
        (["--weight-dtype", "gguf"], "'gguf' .* needs a GGUF model .* got --model 'tiny'"),
        (
            ["--weight-dtype", "gguf", "--model", "smollm2", "--dtype", "bfloat16"],
            "'gguf' multiplies float32 activations",
        ),
    ],
)
def test_dtypes_are_checked_by_flag_before_any_load(flags: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse(["--role", "leader", *flags])


def test_weight_dtype_reaches_the_built_model() -> None:
    import torch

    from engine.backends.builtin.shard import build_model
    from engine.model import TPContext

    settings = parse(["--role", "leader", "--weight-dtype", "float16"])
    model, _, _ = build_model(settings, TPContext())
    assert model.layers[0].mlp.down_proj.weight.dtype == torch.float16
    assert model.dtype == torch.float32


def test_gguf_weight_dtype_keeps_the_files_blocks() -> None:
    from engine.backends.builtin.shard import build_model
    from engine.model import TPContext, blocks

    settings = parse(["--role", "leader", "--weight-dtype", "gguf", "--model", "smollm2"])
    model, _, _ = build_model(settings, TPContext())
    down = model.layers[0].mlp.down_proj.weight
    assert down.dtype == blocks.BLOCKS and down.shape == (576, 1536 // 32 * 20)  # Q4_1
    assert model.embed_tokens.weight.shape == (49152, 576 // 32 * 34)  # Q8_0
    assert model.lm_head.weight is model.embed_tokens.weight  # tied, stored once


def test_the_gateway_knows_the_engines_weight_dtypes() -> None:
    """The gateway keeps a copy (it must not need the engine installed): the same names."""
    from engine.model.gguf import PACKAGED
    from engine.settings import WEIGHT_DTYPES
    from gateway.config.unit import PACKAGED_MODELS
    from gateway.config.unit import WEIGHT_DTYPES as GATEWAY_WEIGHT_DTYPES

    assert GATEWAY_WEIGHT_DTYPES == WEIGHT_DTYPES
    assert tuple(PACKAGED) == PACKAGED_MODELS


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--prefill-chunk", "0"], "--prefill-chunk: must be >= 1 token, got 0"),
        (
            ["--prefill-chunk", "64", "--backend", "vllm", "--model", "/m"],
            "--prefill-chunk: only applies to --backend builtin .*max_num_batched_tokens.* 64",
        ),
    ],
)
def test_prefill_chunk_is_checked_by_flag(flags: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse(["--role", "leader", *flags])


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--pp", "0"], "--pp: must be >= 1, got 0"),
        (
            ["--world-size", "3", "--pp", "2"],
            "--pp: 2 pipeline stages do not divide --world-size 3",
        ),
        (
            ["--world-size", "2", "--pp", "2", "--backend", "vllm", "--model", "/m"],
            "--pp: only applies to --backend builtin .*got 2 with --backend vllm",
        ),
    ],
)
def test_pp_is_checked_by_flag(flags: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse(["--role", "leader", *flags])


def test_vllm_units_refuse_pipeline_stages_by_name() -> None:
    """vLLM's CPU build cannot run them across nodes (engine/backends/vllm/args.py says what
    was tried), so neither `--pp` nor vLLM's own argument gets through."""
    with pytest.raises(ValueError, match="'pipeline_parallel_size' = 2: vLLM's CPU build"):
        check_keys({"pipeline_parallel_size": 2}, "engine_args")
    check_keys({"pipeline_parallel_size": 1}, "engine_args")


@pytest.mark.parametrize(
    ("flags", "budget"), [([], DEFAULT_PREFILL_CHUNK), (["--prefill-chunk", "48"], 48)]
)
def test_prefill_chunk_is_the_leaders_step_budget(flags: list[str], budget: int) -> None:
    from engine.backends.builtin.node import start_leader

    engine = start_leader(parse(["--role", "leader", *flags]))
    try:
        assert engine.scheduler.config.max_num_batched_tokens == budget
    finally:
        engine.shutdown()


def test_the_documented_prefill_chunk_is_the_engines_default() -> None:
    """The gateway never reads the engine's default, so the reference and config.toml state
    it; they must state the engine's own."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    page = (root / "docs" / "configuration.md").read_text().splitlines()
    row = next(line for line in page if line.startswith("| `prefill_chunk` |"))
    assert row.startswith(f"| `prefill_chunk` | `{DEFAULT_PREFILL_CHUNK}` |")
    toml = (root / "config.toml").read_text()
    assert toml.count(f"prefill_chunk = {DEFAULT_PREFILL_CHUNK} ") == 2
