"""Device and dtype selection in one place, so a CUDA or Neuron executor can replace it."""

from __future__ import annotations

import torch

from engine.model.blocks import BLOCKS
from engine.settings import DTYPES, WEIGHT_DTYPES

_DTYPES: dict[str, torch.dtype] = {name: getattr(torch, name) for name in DTYPES}


def select_device(name: str = "cpu", dtype: str | None = None) -> tuple[torch.device, torch.dtype]:
    """Resolve a device name ("cpu", "cuda", "cuda:1") and a dtype name.

    Every other module takes the pair as arguments instead of guessing, so swapping the
    accelerator means changing this function only. CPU defaults to float32 (half-precision
    matmuls on CPU are slow and lose the bit-for-bit TP comparisons the tests rely on);
    CUDA defaults to bfloat16.
    """
    kind = name.split(":", 1)[0]
    if kind not in ("cpu", "cuda"):
        raise ValueError(f"device: unsupported device {name!r} (expected 'cpu' or 'cuda[:N]')")
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device: {name!r} requested but CUDA is not available")
    dtype_name = dtype or ("float32" if kind == "cpu" else "bfloat16")
    if dtype_name not in _DTYPES:
        raise ValueError(
            f"dtype: unsupported dtype {dtype_name!r} (expected one of {list(_DTYPES)})"
        )
    return torch.device(name), _DTYPES[dtype_name]


def weight_dtype(name: str | None, dtype: torch.dtype) -> torch.dtype:
    """How the matrices are stored: `name`, or the arithmetic's `dtype` when unset; "gguf"
    is `BLOCKS` (the file's quantized blocks, see engine.model.blocks)."""
    if name is None:
        return dtype
    if name not in WEIGHT_DTYPES:
        raise ValueError(f"weight_dtype: unsupported {name!r} (expected one of {WEIGHT_DTYPES})")
    return BLOCKS if name == "gguf" else _DTYPES[name]
