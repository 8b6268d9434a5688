"""A GGUF's metadata as the builtin transformer's ModelConfig, refusing what it would compute
wrong: another architecture, experts, biases, partial or scaled rotary, odd head sizes."""

from __future__ import annotations

from engine.model.config import ModelConfig
from engine.model.gguf.file import GGUFFile

ARCHITECTURE = "llama"


def check_architecture(file: GGUFFile) -> None:
    arch = file.string("general.architecture")
    if arch != ARCHITECTURE:
        raise ValueError(
            f"general.architecture: the builtin engine runs Llama-architecture GGUF files "
            f"only, {file.path.name} is {arch!r} (serve it with --backend vllm instead)"
        )


def gguf_config(file: GGUFFile, max_seq_len: int | None = None) -> ModelConfig:
    """`max_seq_len` caps the context (each KV-cache slot holds that many positions)."""
    check_architecture(file)

    def key(name: str) -> str:
        return f"{ARCHITECTURE}.{name}"

    hidden = file.integer(key("embedding_length"))
    heads = file.integer(key("attention.head_count"))
    _refuse_unsupported(file, hidden // max(heads, 1))
    embedding = file.tensors.get("token_embd.weight")
    if embedding is None:
        raise ValueError(f"token_embd.weight: missing from {file.path.name}")
    context = file.integer(key("context_length"))
    return ModelConfig(
        vocab_size=int(embedding.shape[1]),  # GGUF shapes list the fastest dim first
        hidden_size=hidden,
        num_layers=file.integer(key("block_count")),
        num_heads=heads,
        num_kv_heads=file.integer(key("attention.head_count_kv"), heads),
        intermediate_size=file.integer(key("feed_forward_length")),
        rope_theta=file.number(key("rope.freq_base"), 10000.0),
        rms_norm_eps=file.number(key("attention.layer_norm_rms_epsilon"), 1e-5),
        max_seq_len=context if max_seq_len is None else max_seq_len,
        tie_embeddings="output.weight" not in file.tensors,
    )


def _refuse_unsupported(file: GGUFFile, head_dim: int) -> None:
    if file.integer(f"{ARCHITECTURE}.expert_count", 0) > 0:
        raise ValueError(f"{ARCHITECTURE}.expert_count: mixture-of-experts is not supported")
    for name in ("rope.dimension_count", "attention.key_length", "attention.value_length"):
        value = file.integer(f"{ARCHITECTURE}.{name}", head_dim)
        if value != head_dim:
            raise ValueError(
                f"{ARCHITECTURE}.{name}: {value} differs from embedding_length/head_count="
                f"{head_dim}"
            )
    scaling = file.string(f"{ARCHITECTURE}.rope.scaling.type", "none")
    if scaling != "none" or "rope_freqs.weight" in file.tensors:
        raise ValueError(f"{ARCHITECTURE}.rope.scaling.type: only unscaled rotary is supported")
    biases = sorted(n for n in file.tensors if n.startswith("blk.0.") and n.endswith(".bias"))
    if biases:
        raise ValueError(f"{biases[0]}: biases are not supported")
