"""Correctness anchor: our logits match transformers' LlamaForCausalLM on the same weights."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.model import ModelConfig, TPContext, load_hf_folder
from tests.engine.test_model_tp import hf_logits, run_group

PROMPT = [1, 17, 42, 99, 255, 3, 8, 150, 299, 0]
DECODE = [7, 123, 45]


@pytest.fixture(scope="module")
def hf_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.Tensor]:
    """A random tiny Llama saved as a local HF folder, and transformers' own logits."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=300,
        intermediate_size=160,
        max_position_embeddings=64,
        attn_implementation="eager",
    )
    torch.manual_seed(1234)
    model = LlamaForCausalLM(config).eval()
    folder = tmp_path_factory.mktemp("hf")
    model.save_pretrained(folder, safe_serialization=True)
    ids = PROMPT + DECODE
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0]
    expected = logits[len(PROMPT) - 1 :]
    return folder, expected


def test_config_from_hf(hf_model: tuple[Path, torch.Tensor]) -> None:
    config = ModelConfig.from_hf(hf_model[0])
    assert (config.hidden_size, config.num_heads, config.num_kv_heads) == (64, 4, 2)
    assert (config.vocab_size, config.max_seq_len, config.head_dim) == (300, 64, 16)


def test_matches_transformers_tp1(hf_model: tuple[Path, torch.Tensor]) -> None:
    folder, expected = hf_model
    result = hf_logits(TPContext(), str(folder), PROMPT, DECODE)
    torch.testing.assert_close(result["logits"], expected, atol=1e-4, rtol=0)


@pytest.mark.slow
def test_matches_transformers_tp2(hf_model: tuple[Path, torch.Tensor], tmp_path: Path) -> None:
    folder, expected = hf_model
    for result in run_group(2, hf_logits, (str(folder), PROMPT, DECODE), tmp_path):
        torch.testing.assert_close(result["logits"], expected, atol=1e-4, rtol=0)


def test_rank_reads_only_its_shard(hf_model: tuple[Path, torch.Tensor]) -> None:
    """Rank 1 of 2 holds the second half of q's rows and of o's columns."""
    full = load_hf_folder(hf_model[0])
    half = load_hf_folder(hf_model[0], tp=TPContext(rank=1, world_size=2))
    q = full.layers[0].self_attn.qkv_proj.weight[:64]  # q's rows come first, then k's and v's
    o = full.layers[0].self_attn.o_proj.weight
    assert torch.equal(half.layers[0].self_attn.qkv_proj.weight[:32], q[32:])
    assert torch.equal(half.layers[0].self_attn.o_proj.weight, o[:, 32:])
    assert half.cache.k.shape[2] == 1


def test_tied_embeddings_when_lm_head_absent(tmp_path: Path) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        vocab_size=64,
        intermediate_size=48,
        tie_word_embeddings=True,
    )
    torch.manual_seed(5)
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(tmp_path, safe_serialization=True)
    ours = load_hf_folder(tmp_path, max_seq_len=16)
    with torch.no_grad():
        expected = model(torch.tensor([[1, 2, 3]])).logits[0, -1]
    torch.testing.assert_close(ours([(0, [1, 2, 3], 0)])[0], expected, atol=1e-4, rtol=0)
