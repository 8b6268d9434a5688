"""Weight sources: a seeded generator for models built from code, and local HF folders.

Both hand out tensors by Hugging Face name and let each layer ask for just its shard, so the
same `Transformer.load` serves TP=1 and TP=N and a seeded model is the same function at any
world size.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from engine.model.config import ModelConfig
from engine.model.parallel import TPContext
from engine.model.stages import Part, PartPlan
from engine.model.transformer import Transformer


def _restrict(t: torch.Tensor, rows: slice | None, cols: slice | None) -> torch.Tensor:
    if rows is not None:
        t = t[rows]
    if cols is not None:
        t = t[:, cols]
    return t


class SeedSource:
    """Generates every FULL tensor deterministically from (seed, name), then slices.

    Each name gets its own generator, so the result does not depend on the order in which
    ranks or layers ask. Wasteful (each rank builds whole matrices) but only used for small
    models built from code.
    """

    def __init__(self, config: ModelConfig, seed: int, std: float = 0.02) -> None:
        self.config, self.seed, self.std = config, seed, std

    def has(self, name: str) -> bool:
        return not (name == "lm_head.weight" and self.config.tie_embeddings)

    def get(self, name: str, rows: slice | None = None, cols: slice | None = None) -> torch.Tensor:
        shape = self._shape(name)
        if name.endswith("norm.weight"):
            return _restrict(torch.ones(shape), rows, cols)
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + zlib.crc32(name.encode()))
        full = torch.normal(0.0, self.std, size=shape, generator=generator)
        return _restrict(full, rows, cols)

    def _shape(self, name: str) -> tuple[int, ...]:
        c = self.config
        kv = c.num_kv_heads * c.head_dim
        shapes: dict[str, tuple[int, ...]] = {
            "embed_tokens": (c.vocab_size, c.hidden_size),
            "lm_head": (c.vocab_size, c.hidden_size),
            "norm": (c.hidden_size,),
            "input_layernorm": (c.hidden_size,),
            "post_attention_layernorm": (c.hidden_size,),
            "q_proj": (c.hidden_size, c.hidden_size),
            "k_proj": (kv, c.hidden_size),
            "v_proj": (kv, c.hidden_size),
            "o_proj": (c.hidden_size, c.hidden_size),
            "gate_proj": (c.intermediate_size, c.hidden_size),
            "up_proj": (c.intermediate_size, c.hidden_size),
            "down_proj": (c.hidden_size, c.intermediate_size),
        }
        return shapes[name.split(".")[-2]]


class SafetensorsSource:
    """Reads slices straight from (possibly sharded) safetensors files via `get_slice`, so a
    rank only pulls its own rows or columns of each tensor off the disk."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.files = _weight_map(folder)
        self._handles: dict[str, Any] = {}

    def has(self, name: str) -> bool:
        return name in self.files

    def get(self, name: str, rows: slice | None = None, cols: slice | None = None) -> torch.Tensor:
        if name not in self.files:
            raise KeyError(f"weights: {name!r} not found in {self.folder}")
        file = self.files[name]
        if file not in self._handles:
            self._handles[file] = safe_open(str(self.folder / file), framework="pt")
        view = self._handles[file].get_slice(name)
        full = slice(None)
        if cols is not None:
            tensor: torch.Tensor = view[rows or full, cols]
        elif rows is not None:
            tensor = view[rows]
        else:
            tensor = view[:]
        return tensor


def _weight_map(folder: Path) -> dict[str, str]:
    """Tensor name -> file name, from the shard index or the single file's header."""
    index = folder / "model.safetensors.index.json"
    if index.exists():
        weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
        return weight_map
    files = sorted(p.name for p in folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"weights: no *.safetensors in {folder}")
    names: dict[str, str] = {}
    for file in files:
        with safe_open(str(folder / file), framework="pt") as handle:
            names.update(dict.fromkeys(handle.keys(), file))
    return names


def init_from_seed(
    config: ModelConfig,
    seed: int,
    tp: TPContext | None = None,
    num_slots: int = 8,
    device: torch.device | None = None,
    dtype: torch.dtype = torch.float32,
    weight_dtype: torch.dtype | None = None,
    part: Part | None = None,
) -> Transformer:
    """A model with random weights that is the same function at every world size (and
    `part` of it on a pipeline stage)."""
    model = Transformer(config, tp, num_slots, device, dtype, weight_dtype, part)
    model.load(SeedSource(config, seed))
    return model


def load_hf_folder(
    path: str | Path,
    tp: TPContext | None = None,
    num_slots: int = 8,
    device: torch.device | None = None,
    dtype: torch.dtype = torch.float32,
    max_seq_len: int | None = None,
    weight_dtype: torch.dtype | None = None,
    part: PartPlan | None = None,
) -> Transformer:
    """A local Hugging Face Llama folder, each rank reading only its shard of each tensor
    (of the layers `part` gives it, on a pipeline stage).

    `max_seq_len` caps the KV cache rows (a checkpoint's 128k context would not fit in RAM
    per slot)."""
    folder = Path(path)
    config = ModelConfig.from_hf(folder)
    if max_seq_len is not None:
        config = replace(config, max_seq_len=max_seq_len)
    held = None if part is None else part(config)
    model = Transformer(config, tp, num_slots, device, dtype, weight_dtype, held)
    model.load(SafetensorsSource(folder))
    return model
