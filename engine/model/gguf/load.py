"""A Llama GGUF as this rank's Transformer: config from the metadata, weights sliced then
dequantized per rank (see weights.py)."""

from __future__ import annotations

import torch

from engine.model.gguf.config import gguf_config
from engine.model.gguf.file import GGUFFile
from engine.model.gguf.weights import GGUFSource
from engine.model.parallel import TPContext
from engine.model.stages import PartPlan
from engine.model.transformer import Transformer


def load_gguf(
    file: GGUFFile,
    tp: TPContext | None = None,
    num_slots: int = 8,
    device: torch.device | None = None,
    dtype: torch.dtype = torch.float32,
    max_seq_len: int | None = None,
    weight_dtype: torch.dtype | None = None,
    part: PartPlan | None = None,
) -> Transformer:
    """`max_seq_len` caps the KV cache rows (SmolLM2's 8192 positions are 377 MB per slot at
    TP=1 in float32); `part` picks a pipeline stage's layers once the config is read."""
    config = gguf_config(file, max_seq_len)
    held = None if part is None else part(config)
    model = Transformer(config, tp, num_slots, device, dtype, weight_dtype, held)
    model.load(GGUFSource(file, config.head_dim))
    return model
