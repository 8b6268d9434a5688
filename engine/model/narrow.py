"""Weights stored narrower than the arithmetic: float16 matrices or a GGUF file's quantized
blocks (`engine.model.blocks`), float32 activations.

Decoding one token reads every weight once, so on a CPU a decode step is bound by memory
bandwidth, not by arithmetic: SmolLM2's 135M float32 weights are 540 MB per step, half that in
float16. Two ways to multiply by a narrow weight, each best at one batch size:

- **A few rows (decode of one to three sequences):** the narrow matmul itself, with the rows
  cast to the weight's dtype and the result cast back. torch's float16 GEMV reads the weight
  once and accumulates in float32; the inputs and outputs are rounded to float16 (2^-11
  relative). A value beyond float16's range would turn to inf and then to NaN logits, so
  `Transformer.forward` checks its logits and runs such a step again under `widened()`.
- **More rows:** widen the weight, a chunk of rows at a time, into a float32 scratch buffer
  that stays in the cache, and multiply in float32. Where the CPU has no float16 arithmetic
  (AVX2) torch's float16 GEMM is slower than float32, so this is the only way a batch gains.

Either way the weights' own rounding (2^-11 relative) is far below the 4-bit steps of a Q4_1
file's values. Measured on this project's 2-core machine (AVX2, one thread) per 1536 x 576
matrix, batch 1 / 8: float32 weights 590 / 830 us; float16 narrow matmul 300 / 1,310 us;
float16 widened 400 / 540 us.

Blocks (a GGUF's Q4_1 / Q8_0, `engine.model.blocks`) take the same two ways: up to
`blocks.FUSED_ROWS` rows the fused kernel (the file's exact values, decoded in registers:
about 190 / 360 us for that matrix), beyond that widened a chunk at a time like float16.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from engine.model import blocks

# Up to this many rows, multiply in the weight's dtype (measured crossover: 3 to 4 rows).
NARROW_ROWS = 3
# Rows widened at once, as float32 elements: 1M is 4 MB, which stays in the last-level cache
# for the matmul that reads it right after.
CHUNK_ELEMENTS = 1 << 20

_local = threading.local()


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x @ weight.T in x's dtype, whatever dtype `weight` is stored in."""
    if weight.dtype == x.dtype:
        return nn.functional.linear(x, weight)
    packed = weight.dtype == blocks.BLOCKS
    if packed and x.shape[0] <= blocks.FUSED_ROWS:
        return blocks.matmul(x, weight)
    if not packed and x.shape[0] <= NARROW_ROWS and not getattr(_local, "widen", False):
        return nn.functional.linear(x.to(weight.dtype), weight).to(x.dtype)
    rows, cols = weight.shape[0], x.shape[-1]
    step = max(1, CHUNK_ELEMENTS // cols)
    if rows <= step:
        return nn.functional.linear(x, _widened(weight, cols, x.dtype))
    parts = [
        nn.functional.linear(x, _widened(weight[start : start + step], cols, x.dtype))
        for start in range(0, rows, step)
    ]
    return torch.cat(parts, dim=-1)


@contextmanager
def widened() -> Iterator[None]:
    """Within: every narrow weight is widened, whatever the rows (no float16 activations)."""
    before = getattr(_local, "widen", False)
    _local.widen = True
    try:
        yield
    finally:
        _local.widen = before


def _widened(weight: torch.Tensor, cols: int, dtype: torch.dtype) -> torch.Tensor:
    """`weight` (rows of `cols` values) copied into this thread's scratch buffer as `dtype`
    (a view of the buffer, valid until the next call). One buffer per thread, grown to the
    largest chunk once, so widening never allocates in a step."""
    size = weight.shape[0] * cols
    buffer: torch.Tensor | None = getattr(_local, "buffer", None)
    if (
        buffer is None
        or buffer.numel() < size
        or buffer.dtype != dtype
        or buffer.device != weight.device
    ):
        # A normal tensor even when first needed under inference_mode (as in a forward):
        # an inference tensor could not be written outside it afterwards.
        with torch.inference_mode(False):
            buffer = torch.empty(max(size, CHUNK_ELEMENTS), dtype=dtype, device=weight.device)
        _local.buffer = buffer
    view = buffer[:size].view(weight.shape[0], cols)
    if weight.dtype == blocks.BLOCKS:
        return blocks.dequantize_into(view, weight)
    view.copy_(weight)
    return view
