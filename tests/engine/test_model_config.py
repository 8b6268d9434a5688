"""Config and tensor-parallel validation: errors name the field before any work starts."""

from __future__ import annotations

import itertools
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
        (ModelConfig.tiny(), 5, "num_kv_heads"),
        (replace(ModelConfig.tiny(), num_kv_heads=2), 4, "num_kv_heads"),
        (replace(ModelConfig.tiny(), intermediate_size=690), 4, "intermediate_size"),
    ],
)
def test_shapes_that_cannot_split_name_the_field(
    config: ModelConfig, world: int, field: str
) -> None:
    """Fewer KV heads than ranks, or an MLP that does not divide, fails before allocating."""
    with pytest.raises(ValueError, match=f"{field}.*world_size={world}"):
        Transformer(config, TPContext(rank=0, world_size=world))


@pytest.mark.parametrize(
    ("world", "kv_heads"),
    [(1, [3]), (2, [2, 1]), (3, [1, 1, 1])],
)
def test_kv_groups_split_unevenly(world: int, kv_heads: list[int]) -> None:
    """SmolLM2's 9 query / 3 KV heads: whole KV groups per rank, the first ranks take more,
    and the shards tile the heads and the MLP exactly."""
    config = ModelConfig(
        vocab_size=64,
        hidden_size=576,
        num_layers=1,
        num_heads=9,
        num_kv_heads=3,
        intermediate_size=1536,
        max_seq_len=8,
    )
    ranks = [Transformer(config, TPContext(rank=r, world_size=world)) for r in range(world)]
    attention = [m.layers[0].self_attn for m in ranks]
    assert [a.num_kv_heads for a in attention] == kv_heads
    assert [a.num_heads for a in attention] == [3 * k for k in kv_heads]
    assert [m.cache.k.shape[2] for m in ranks] == kv_heads
    q_rows = [(a.qkv_proj.rows["q_proj"].start, a.qkv_proj.rows["q_proj"].stop) for a in attention]
    assert q_rows[0][0] == 0 and q_rows[-1][1] == 576
    assert all(a[1] == b[0] for a, b in itertools.pairwise(q_rows))
    assert sum(m.layers[0].mlp.down_proj.weight.shape[1] for m in ranks) == 1536


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
