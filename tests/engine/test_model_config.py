"""Config and tensor-parallel validation: errors name the field before any work starts."""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path

import pytest
import torch

from engine.device import select_device
from engine.model import ByteTokenizer, ModelConfig, TPContext, Transformer


def test_tiny_covers_byte_tokenizer_and_uses_gqa() -> None:
    tiny = ModelConfig.tiny()
    assert tiny.vocab_size >= ByteTokenizer().vocab_size
    assert tiny.num_kv_heads < tiny.num_heads


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"vocab_size": 0}, "vocab_size"),
        ({"num_layers": -1}, "num_layers"),
        ({"hidden_size": 250}, "hidden_size"),
        ({"num_kv_heads": 3}, "num_kv_heads"),
        ({"rms_norm_eps": 0.0}, "rms_norm_eps"),
        ({"max_seq_len": 1.5}, "max_seq_len"),
    ],
)
def test_bad_config_names_the_field(change: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        ModelConfig(**{**asdict(ModelConfig.tiny()), **change})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("config", "world", "field"),
    [
        (ModelConfig.tiny(), 3, "num_heads"),
        (replace(ModelConfig.tiny(), num_kv_heads=2), 4, "num_kv_heads"),
        (replace(ModelConfig.tiny(), intermediate_size=690), 4, "intermediate_size"),
    ],
)
def test_heads_must_divide_by_world_size(config: ModelConfig, world: int, field: str) -> None:
    with pytest.raises(ValueError, match=f"{field}.*world_size={world}"):
        Transformer(config, TPContext(rank=0, world_size=world))


def test_tp_context_rejects_bad_rank() -> None:
    with pytest.raises(ValueError, match="rank"):
        TPContext(rank=2, world_size=2)


def test_from_hf_rejects_unsupported(tmp_path: Path) -> None:
    raw = {
        "model_type": "llama",
        "vocab_size": 10,
        "hidden_size": 8,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "intermediate_size": 16,
        "rope_parameters": {"rope_type": "llama3", "rope_theta": 1e4},
    }
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ValueError, match="rope_type"):
        ModelConfig.from_hf(tmp_path)


def test_select_device() -> None:
    assert select_device("cpu") == (torch.device("cpu"), torch.float32)
    assert select_device("cpu", "bfloat16")[1] == torch.bfloat16
    with pytest.raises(ValueError, match="device"):
        select_device("tpu")
    with pytest.raises(ValueError, match="dtype"):
        select_device("cpu", "int8")
