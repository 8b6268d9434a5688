"""Device and dtype selection in one place, so a CUDA or Neuron executor can replace it."""

from __future__ import annotations

import torch

_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}


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
    """How the matrices are stored: `name`, or the arithmetic's `dtype` when unset."""
    if name is None:
        return dtype
    if name not in _DTYPES:
        raise ValueError(f"weight_dtype: unsupported {name!r} (expected one of {list(_DTYPES)})")
    return _DTYPES[name]
