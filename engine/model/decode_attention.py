"""Decode attention over the paged KV cache: each entry's one new query token against every
position it may see, read through its block table where the keys and values live.

Two ways give the same values up to the order of the sums: the C kernel
(`engine/model/kernels/attention.c`, called through a `Step`), which reads each cached row
once and copies nothing, and torch's (`KVCache.write_read` gathers each entry's blocks into a
padded copy, `attend_gathered` runs one masked SDPA over it), which runs where the kernel
cannot: no C compiler, or an arithmetic other than float32. The model picks once, at start
(`available`); the tests hold the two to each other.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from engine.model import kernels

# The kernel's paths, by their C function: the fastest this CPU has, and plain C.
_PATHS = {"best": "ug_attend_decode", "portable": "ug_attend_decode_portable"}
PATHS = tuple(_PATHS)


def available(dtype: torch.dtype) -> bool:
    """Whether the kernel runs for a cache of `dtype` on this machine (built on first ask)."""
    return dtype == torch.float32 and kernels.builds("attention")


class Step:
    """A decode step's entries as the kernel takes them, prepared once for every layer: the
    cache row each entry's new key and value go to (B,), the blocks each reads (B, width),
    the positions each sees (B,: 0 .. length - 1, within its table), and the rotary angles at
    each entry's position ((cos, sin), each (B, ..., dim)) to rotate the new query and key
    first, or None if they come rotated. Calling it for a layer writes and attends."""

    __slots__ = ("_fixed", "_function", "_held", "batch", "block_size", "rotates")

    def __init__(
        self,
        rows: torch.Tensor,
        tables: torch.Tensor,
        lengths: torch.Tensor,
        block_size: int,
        angles: tuple[torch.Tensor, torch.Tensor] | None = None,
        path: str = "best",
    ) -> None:
        function = _PATHS.get(path)
        if function is None:
            raise ValueError(f"path: one of {PATHS}, not {path!r}")
        self._function = getattr(kernels.optional_library("attention"), function)
        self.batch, self.block_size, self.rotates = len(rows), block_size, angles is not None
        rows, tables, lengths = (t.to(torch.int64).contiguous() for t in (rows, tables, lengths))
        cos, sin = (None, None)
        if angles is not None:
            if any(t.dtype != torch.float32 for t in angles):
                raise TypeError(f"dtype: the kernel rotates in float32, not {angles[0].dtype}")
            cos, sin = (t.reshape(self.batch, -1).contiguous() for t in angles)
        # The tensors whose addresses the kernel is given stay alive as long as this step.
        self._held = (rows, tables, lengths, cos, sin)
        self._fixed = (
            None if cos is None else cos.data_ptr(),
            None if sin is None else sin.data_ptr(),
            rows.data_ptr(),
            tables.data_ptr(),
            tables.shape[1],
            lengths.data_ptr(),
        )

    def __call__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cache: tuple[torch.Tensor, torch.Tensor],
    ) -> torch.Tensor:
        """Write each entry's key and value to its cache row, then attend: (B, heads, dim).

        q: (B, heads, dim) and k, v: (B, kv_heads, dim), the entries' new query, key and
        value (rows may be strided, heads not); cache: one layer's (keys, values), each
        (cache rows, kv_heads, dim), contiguous, written in place."""
        keys, values = cache
        batch, heads, dim = q.shape
        if q.dtype != torch.float32 or keys.dtype != torch.float32:
            raise TypeError(f"dtype: the kernel attends in float32, got {q.dtype}, {keys.dtype}")
        if k.dtype != torch.float32 or v.dtype != torch.float32:
            raise TypeError(f"dtype: the kernel attends in float32, got {k.dtype}, {v.dtype}")
        if not (keys.is_contiguous() and values.is_contiguous()):
            raise ValueError("cache: the layer's keys and values must be contiguous")
        if batch != self.batch or len(k) != batch or len(v) != batch:
            raise ValueError(f"q, k, v: {batch}, {len(k)}, {len(v)} rows for {self.batch} entries")
        q, k, v = _rows(q), _rows(k), _rows(v)
        cos, sin, rows, tables, width, lengths = self._fixed
        out = torch.empty(batch, heads, dim, dtype=torch.float32)
        status = self._function(
            self.batch,
            heads,
            keys.shape[1],
            dim,
            q.data_ptr(),
            q.stride(0),
            k.data_ptr(),
            k.stride(0),
            v.data_ptr(),
            v.stride(0),
            cos,
            sin,
            rows,
            keys.shape[0],
            keys.data_ptr(),
            values.data_ptr(),
            tables,
            width,
            lengths,
            self.block_size,
            1.0 / math.sqrt(dim),
            out.data_ptr(),
        )
        if status:
            held_rows, _, held_lengths = self._held[:3]
            raise ValueError(
                f"attend: the kernel refused heads={heads}, kv_heads={keys.shape[1]}, "
                f"dim={dim}, block_size={self.block_size}, rows {held_rows.tolist()}, "
                f"lengths {held_lengths.tolist()} for tables of {width} blocks in a cache of "
                f"{keys.shape[0]} rows (status {status}); nothing was written"
            )
        return out


def _rows(t: torch.Tensor) -> torch.Tensor:
    """`t` (B, heads, dim) as the kernel reads it: rows at any stride, heads and values
    packed within a row."""
    if t.stride(2) != 1 or t.stride(1) != t.shape[2]:
        return t.contiguous()
    return t


def visible(tables: torch.Tensor, lengths: torch.Tensor, block_size: int) -> torch.Tensor:
    """Which gathered positions each entry may see, (B, 1, 1, width * block_size), as
    `attend_gathered` takes it."""
    seen = torch.arange(tables.shape[1] * block_size, device=tables.device)
    return (seen[None, :] < lengths[:, None])[:, None, None, :]


def attend_gathered(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """torch's path, (B, heads, dim): keys and values gathered per entry, (B, positions,
    kv_heads, dim) (`KVCache.write_read`), and one masked SDPA over the batch."""
    out = nn.functional.scaled_dot_product_attention(
        q[:, :, None], keys.transpose(1, 2), values.transpose(1, 2), attn_mask=mask, enable_gqa=True
    )
    return out[:, :, 0]
