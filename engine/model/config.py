"""Model shape: one frozen value shared by the weights, the KV cache and the forward pass."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ModelConfig:
    """A Llama-style decoder's hyper-parameters, validated when built."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    max_seq_len: int = 2048
    tie_embeddings: bool = False

    def __post_init__(self) -> None:
        for name in (
            "vocab_size",
            "hidden_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "intermediate_size",
            "max_seq_len",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name}: must be a positive integer, got {value!r}")
        for name in ("rope_theta", "rms_norm_eps"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or value <= 0:
                raise ValueError(f"{name}: must be a positive number, got {value!r}")
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"hidden_size: {self.hidden_size} is not divisible by num_heads={self.num_heads}"
            )
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_kv_heads: num_heads={self.num_heads} is not a multiple of "
                f"num_kv_heads={self.num_kv_heads}"
            )
        if self.head_dim % 2:
            raise ValueError(f"num_heads: head_dim={self.head_dim} must be even for rotary")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @classmethod
    def tiny(cls) -> ModelConfig:
        """A small model built from code: fast on CPU, with GQA, and a vocab that covers the
        byte tokenizer (262 ids) with room to spare."""
        return cls(
            vocab_size=512,
            hidden_size=256,
            num_layers=4,
            num_heads=8,
            num_kv_heads=4,
            intermediate_size=688,
            max_seq_len=512,
        )

    @classmethod
    def from_hf(cls, path: str | Path) -> ModelConfig:
        """Read a Hugging Face Llama `config.json` (a file or the folder holding it)."""
        file = Path(path)
        if file.is_dir():
            file = file / "config.json"
        raw: dict[str, Any] = json.loads(file.read_text())
        _check_hf_supported(raw)
        num_heads = int(raw["num_attention_heads"])
        return cls(
            vocab_size=int(raw["vocab_size"]),
            hidden_size=int(raw["hidden_size"]),
            num_layers=int(raw["num_hidden_layers"]),
            num_heads=num_heads,
            num_kv_heads=int(raw.get("num_key_value_heads") or num_heads),
            intermediate_size=int(raw["intermediate_size"]),
            rope_theta=float(_rope(raw).get("rope_theta", raw.get("rope_theta", 10000.0))),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            max_seq_len=int(raw.get("max_position_embeddings", 2048)),
            tie_embeddings=bool(raw.get("tie_word_embeddings", False)),
        )


def _rope(raw: dict[str, Any]) -> dict[str, Any]:
    """transformers 5 nests rope settings under `rope_parameters`; 4.x used `rope_scaling`."""
    params = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    return dict(params)


def _check_hf_supported(raw: dict[str, Any]) -> None:
    """Refuse configs this implementation would silently compute wrong."""
    model_type = raw.get("model_type", "llama")
    if model_type != "llama":
        raise ValueError(f"model_type: only 'llama' is supported, got {model_type!r}")
    rope_type = _rope(raw).get("rope_type", _rope(raw).get("type", "default"))
    if rope_type != "default":
        raise ValueError(
            f"rope_parameters.rope_type: only 'default' is supported, got {rope_type!r}"
        )
    for flag in ("attention_bias", "mlp_bias"):
        if raw.get(flag):
            raise ValueError(f"{flag}: biases are not supported")
    if raw.get("hidden_act", "silu") != "silu":
        raise ValueError(f"hidden_act: only 'silu' is supported, got {raw.get('hidden_act')!r}")
    head_dim = raw.get("head_dim")
    expected = int(raw["hidden_size"]) // int(raw["num_attention_heads"])
    if head_dim is not None and int(head_dim) != expected:
        raise ValueError(f"head_dim: {head_dim} differs from hidden_size/num_heads={expected}")
