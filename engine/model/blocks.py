"""Matrices kept in a GGUF file's own quantized blocks (`weight_dtype = "gguf"`).

A rank stores its shard of each matrix as the file's bytes, a uint8 tensor of rows x (blocks
per row x block bytes), and multiplies by it with `engine/model/kernels` (a fused C kernel that
decodes each block in registers). Decode reads 0.625 bytes a value for Q4_1 and 1.06 for Q8_0
against 2 for float16, which is what a bandwidth-bound decode step is paid in. The decoded
values are exactly gguf's dequantizer's, so the results match the float32 path up to the
order of the sums.

A weight's format is not stored beside it: Q4_1 and Q8_0 blocks differ in size (20 and 34
bytes per 32 values), so bytes per row against the values per row name it.
"""

from __future__ import annotations

import torch

from engine.model import kernels

BLOCKS = torch.uint8  # the storage dtype of a matrix in blocks
VALUES = 32  # per block, in both formats
# Up to this many rows the fused kernel runs; beyond, `narrow` widens chunks of the matrix to
# float32 for torch's GEMM, which wins once decoding is spread over enough rows (measured
# crossover here: about 24 rows).
FUSED_ROWS = 16
# format name -> (the kernel's format code, bytes per block)
FORMATS: dict[str, tuple[int, int]] = {"Q4_1": (0, 20), "Q8_0": (1, 34)}
_CODES = {size: code for code, size in FORMATS.values()}


def code(weight: torch.Tensor, cols: int) -> int:
    """The kernel's format code of `weight`, a matrix of `cols` values per row."""
    if cols % VALUES:
        raise ValueError(f"weights: {cols} values per row are not whole blocks of {VALUES}")
    per_block, rest = divmod(weight.shape[-1], cols // VALUES)
    if rest or per_block not in _CODES:
        raise ValueError(
            f"weights: {weight.shape[-1]} bytes per row of {cols} values is no known block "
            f"format (known: {sorted(FORMATS)})"
        )
    return _CODES[per_block]


# The kernel's paths, by their C function: the fastest this CPU has (AVX-512 for a batch of
# rows, else AVX2, else plain C), AVX2 alone, and plain C, which every CPU runs (the tests
# compare them).
_PATHS = {"best": "ug_matmul", "avx2": "ug_matmul_avx2", "portable": "ug_matmul_portable"}
PATHS = tuple(_PATHS)


def matmul(x: torch.Tensor, weight: torch.Tensor, path: str = "best") -> torch.Tensor:
    """x @ W.T for float32 rows x (tokens, cols) and W in blocks (out features, bytes), by
    one of the kernel's `PATHS`."""
    function = _PATHS.get(path)
    if function is None:
        raise ValueError(f"path: one of {PATHS}, not {path!r}")
    if x.dtype != torch.float32:
        raise TypeError(f"dtype: blocks multiply float32 activations, got {x.dtype}")
    x, weight = x.contiguous(), weight.contiguous()
    rows, cols = x.shape
    out = torch.empty(rows, weight.shape[0], dtype=torch.float32)
    getattr(kernels.library(), function)(
        code(weight, cols),
        x.data_ptr(),
        rows,
        cols,
        weight.data_ptr(),
        weight.shape[0],
        out.data_ptr(),
    )
    return out


def dequantize_into(
    out: torch.Tensor,
    weight: torch.Tensor,
    rows: torch.Tensor | None = None,
    portable: bool = False,
) -> torch.Tensor:
    """Fill `out` (n x cols, float32, contiguous) with the values of `weight`'s rows: `rows`
    (int64 indices), or all of them in order."""
    n, cols = out.shape
    index = None
    if rows is not None:
        index = rows.to(torch.int64).contiguous()
        if index.numel() and (int(index.min()) < 0 or int(index.max()) >= weight.shape[0]):
            raise IndexError(f"rows: out of range for {weight.shape[0]} rows")
    elif n != weight.shape[0]:
        raise ValueError(f"out: {n} rows for a weight of {weight.shape[0]}")
    if out.dtype != torch.float32 or not out.is_contiguous():
        raise ValueError("out: must be contiguous float32")
    lib = kernels.library()
    run = lib.ug_dequant_portable if portable else lib.ug_dequant
    weight = weight.contiguous()
    indices = None if index is None else index.data_ptr()
    run(code(weight, cols), weight.data_ptr(), cols, indices, n, out.data_ptr())
    return out


def dequantize(
    weight: torch.Tensor, cols: int, rows: torch.Tensor | None = None, portable: bool = False
) -> torch.Tensor:
    """The float32 values of `weight` (or of its `rows`), as a new tensor."""
    n = weight.shape[0] if rows is None else rows.numel()
    out = torch.empty(n, cols, dtype=torch.float32)
    return dequantize_into(out, weight, rows, portable)
