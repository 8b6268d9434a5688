"""The builtin model: a tensor-parallel Llama-style decoder, its weights and tokenizers."""

from engine.model.config import ModelConfig
from engine.model.kvcache import KVCache
from engine.model.parallel import (
    ColumnParallelLinear,
    ReplicatedEmbedding,
    ReplicatedLinear,
    RowParallelLinear,
    TPContext,
    WeightSource,
)
from engine.model.tokenizer import ByteTokenizer, DetokenizeStream, HFTokenizer, Tokenizer
from engine.model.transformer import Entry, Transformer
from engine.model.weights import SafetensorsSource, SeedSource, init_from_seed, load_hf_folder

__all__ = [
    "ByteTokenizer",
    "ColumnParallelLinear",
    "DetokenizeStream",
    "Entry",
    "HFTokenizer",
    "KVCache",
    "ModelConfig",
    "ReplicatedEmbedding",
    "ReplicatedLinear",
    "RowParallelLinear",
    "SafetensorsSource",
    "SeedSource",
    "TPContext",
    "Tokenizer",
    "Transformer",
    "WeightSource",
    "init_from_seed",
    "load_hf_folder",
]
