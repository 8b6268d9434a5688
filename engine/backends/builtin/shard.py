"""This rank's shard of the model, loaded before the rank joins its unit's group."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch

from engine.device import select_device, weight_dtype
from engine.model import (
    ByteTokenizer,
    HFTokenizer,
    ModelConfig,
    Tokenizer,
    TPContext,
    Transformer,
    init_from_seed,
    load_hf_folder,
)
from engine.model.gguf import (
    PACKAGED,
    GGUFFile,
    gguf_path,
    gguf_tokenizer,
    is_gguf,
    load_gguf,
)
from engine.runtime.group import init_unit_group
from engine.settings import NodeSettings


def build_model(settings: NodeSettings, tp: TPContext) -> tuple[Transformer, Tokenizer, str]:
    """The rank's shard, the tokenizer and the served model name, for `--model`: 'tiny'
    (seeded), a packaged model ('smollm2'), a Llama `.gguf` file or a Hugging Face folder."""
    device, dtype = select_device(settings.device, settings.dtype)
    weights = weight_dtype(settings.weight_dtype, dtype)
    if settings.model == "tiny":
        config = ModelConfig.tiny()
        if settings.max_seq_len is not None:
            config = replace(config, max_seq_len=settings.max_seq_len)
        model = init_from_seed(
            config, settings.seed, tp, settings.num_slots, device, dtype, weight_dtype=weights
        )
        return model, ByteTokenizer(), "tiny"
    if is_gguf(settings.model):
        return _build_gguf(settings, tp, device, dtype, weights)
    folder = Path(settings.model)
    if not folder.is_dir():
        choices = ", ".join(repr(name) for name in ("tiny", *PACKAGED))
        raise ValueError(
            f"model: {settings.model!r} is none of {choices}, a .gguf file or a Hugging Face folder"
        )
    model = load_hf_folder(
        folder, tp, settings.num_slots, device, dtype, settings.max_seq_len, weight_dtype=weights
    )
    return model, HFTokenizer(folder), folder.name


def _build_gguf(
    settings: NodeSettings,
    tp: TPContext,
    device: torch.device,
    dtype: torch.dtype,
    weights: torch.dtype,
) -> tuple[Transformer, Tokenizer, str]:
    packaged = PACKAGED.get(settings.model)
    path = gguf_path(settings.model)
    file = GGUFFile(path)
    model = load_gguf(
        file, tp, settings.num_slots, device, dtype, settings.max_seq_len, weight_dtype=weights
    )
    return model, gguf_tokenizer(file), packaged.name if packaged else path.stem


def build_then_join(settings: NodeSettings) -> tuple[Transformer, Tokenizer, str]:
    """Load first, join after: the group's collective timeout starts ticking once every rank
    has joined, so a rank still reading a big checkpoint must not leave the others waiting
    in a broadcast. Joining waits up to --connect-timeout for the slowest loader."""
    if settings.threads > 0:
        torch.set_num_threads(settings.threads)
    tp = TPContext(rank=settings.rank, world_size=settings.world_size)  # group None: the world
    built = build_model(settings, tp)
    s = settings
    init_unit_group(s.rank, s.world_size, s.master, s.collective_timeout, s.connect_timeout)
    return built
