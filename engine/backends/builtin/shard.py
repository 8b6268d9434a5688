"""This rank's shard of the model, loaded before the rank joins its unit's group.

With `--pp` above 1 the shard is a pipeline stage's (`engine.model.stages`): its layers (and
on stage 0 the embedding and head), split across the stage's ranks as tensor parallelism
does; the rank joins the unit's group, then its stage's group, and runs as a
`PipelineStage`, whose step messages come by `unicast` instead of a broadcast.
"""

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
from engine.model.pipeline import PipelineStage
from engine.model.stages import Layout, PartPlan, plan
from engine.runtime.group import init_unit_group, stage_group
from engine.runtime.stepper import StepModel
from engine.settings import NodeSettings


def build_model(
    settings: NodeSettings, tp: TPContext, part: PartPlan | None = None
) -> tuple[Transformer, Tokenizer, str]:
    """The rank's shard, the tokenizer and the served model name, for `--model`: 'tiny'
    (seeded), a packaged model ('smollm2'), a Llama `.gguf` file or a Hugging Face folder.
    `part`: a pipeline stage's layers (None: all of them)."""
    device, dtype = select_device(settings.device, settings.dtype)
    weights = weight_dtype(settings.weight_dtype, dtype)
    if settings.model == "tiny":
        config = ModelConfig.tiny()
        if settings.max_seq_len is not None:
            config = replace(config, max_seq_len=settings.max_seq_len)
        held = None if part is None else part(config)
        model = init_from_seed(
            config, settings.seed, tp, settings.num_slots, device, dtype, weights, held
        )
        return model, ByteTokenizer(), "tiny"
    if is_gguf(settings.model):
        return _build_gguf(settings, tp, device, dtype, weights, part)
    folder = Path(settings.model)
    if not folder.is_dir():
        choices = ", ".join(repr(name) for name in ("tiny", *PACKAGED))
        raise ValueError(
            f"model: {settings.model!r} is none of {choices}, a .gguf file or a Hugging Face folder"
        )
    model = load_hf_folder(
        folder,
        tp,
        settings.num_slots,
        device,
        dtype,
        settings.max_seq_len,
        weight_dtype=weights,
        part=part,
    )
    return model, HFTokenizer(folder), folder.name


def _build_gguf(
    settings: NodeSettings,
    tp: TPContext,
    device: torch.device,
    dtype: torch.dtype,
    weights: torch.dtype,
    part: PartPlan | None,
) -> tuple[Transformer, Tokenizer, str]:
    packaged = PACKAGED.get(settings.model)
    path = gguf_path(settings.model)
    file = GGUFFile(path)
    model = load_gguf(
        file,
        tp,
        settings.num_slots,
        device,
        dtype,
        settings.max_seq_len,
        weight_dtype=weights,
        part=part,
    )
    return model, gguf_tokenizer(file), packaged.name if packaged else path.stem


def build_then_join(settings: NodeSettings) -> tuple[StepModel, Tokenizer, str]:
    """Load first, join after: the group's collective timeout starts ticking once every rank
    has joined, so a rank still reading a big checkpoint must not leave the others waiting
    in a broadcast. Joining waits up to --connect-timeout for the slowest loader."""
    if settings.threads > 0:
        torch.set_num_threads(settings.threads)
    s = settings
    if s.pp == 1:
        tp = TPContext(rank=s.rank, world_size=s.world_size)  # group None: the world
        built = build_model(settings, tp)
        init_unit_group(s.rank, s.world_size, s.master, s.collective_timeout, s.connect_timeout)
        return built
    layout = Layout(s.rank, s.world_size, s.pp)
    shard = TPContext(rank=layout.tp_rank, world_size=layout.tp)  # its group once joined
    model, tokenizer, name = build_model(settings, shard, plan(layout))
    init_unit_group(s.rank, s.world_size, s.master, s.collective_timeout, s.connect_timeout)
    model.use_group(stage_group(layout))
    return PipelineStage(model, layout), tokenizer, name
