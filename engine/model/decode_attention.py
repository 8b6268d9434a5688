"""Decode attention over the paged KV cache: each entry's one new query token against every
position it may see, read through its block table where the keys and values live.

Two ways give the same values up to the order of the sums: the C kernel
(`engine/model/kernels/attention.c`, `attend`), which reads each cached row once and copies
nothing, and torch's (`KVCache.write_read` gathers each entry's blocks into a padded copy,
`attend_gathered` runs one masked SDPA over it), which runs where the kernel cannot: no C
compiler, or an arithmetic other than float32. The model picks once, at start (`available`);
the tests hold the two to each other.
"""

from __future__ import annotations

import functools
import math

import torch
from torch import nn

from engine.model import kernels

# The kernel's paths, by their C function: the fastest this CPU has, and plain C.
_PATHS = {"best": "ug_attend_decode", "portable": "ug_attend_decode_portable"}
PATHS = tuple(_PATHS)


@functools.cache
def _kernel_builds() -> bool:
    try:
        kernels.attention_library()
    except kernels.KernelUnavailable:
        return False
    return True


def available(dtype: torch.dtype) -> bool:
    """Whether the kernel runs for a cache of `dtype` on this machine (built on first ask)."""
    return dtype == torch.float32 and _kernel_builds()


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cache: tuple[torch.Tensor, torch.Tensor],
    rows: torch.Tensor,
    tables: torch.Tensor,
    lengths: torch.Tensor,
    block_size: int,
    angles: tuple[torch.Tensor, torch.Tensor] | None = None,
    path: str = "best",
) -> torch.Tensor:
    """Write each entry's key and value to its cache row, then attend: (B, heads, dim).

    q: (B, heads, dim) and k, v: (B, kv_heads, dim), each entry's new query, key and value
    (rows may be strided, heads not); angles: the rotary (cos, sin) at each entry's position,
    (B, ..., dim), to rotate q and k first, or None if they are rotated already; cache: one
    layer's (keys, values), each (cache rows, kv_heads, dim), written in place; rows: (B,)
    where each entry's key and value go; tables: (B, width) block ids; lengths: (B,)
    positions each entry sees, 0 .. length - 1, all within its table."""
    function = _PATHS.get(path)
    if function is None:
        raise ValueError(f"path: one of {PATHS}, not {path!r}")
    keys, values = cache
    batch, heads, dim = q.shape
    kv_heads = keys.shape[1]
    tensors = (q, k, v, keys, values, *(angles or ()))
    if any(t.dtype != torch.float32 for t in tensors):
        raise TypeError(f"dtype: the kernel attends in float32, got {[t.dtype for t in tensors]}")
    if not (keys.is_contiguous() and values.is_contiguous()):
        raise ValueError("cache: the layer's keys and values must be contiguous")
    q, k, v = (_rows(t) for t in (q, k, v))
    cos, sin = (None, None) if angles is None else (_packed(t, batch, dim) for t in angles)
    rows = rows.to(torch.int64).contiguous()
    tables = tables.to(torch.int64).contiguous()
    lengths = lengths.to(torch.int64).contiguous()
    out = torch.empty(batch, heads, dim, dtype=torch.float32)
    status = getattr(kernels.attention_library(), function)(
        batch,
        heads,
        kv_heads,
        dim,
        q.data_ptr(),
        q.stride(0),
        k.data_ptr(),
        k.stride(0),
        v.data_ptr(),
        v.stride(0),
        None if cos is None else cos.data_ptr(),
        None if sin is None else sin.data_ptr(),
        rows.data_ptr(),
        keys.shape[0],
        keys.data_ptr(),
        values.data_ptr(),
        tables.data_ptr(),
        tables.shape[1],
        lengths.data_ptr(),
        block_size,
        1.0 / math.sqrt(dim),
        out.data_ptr(),
    )
    if status:
        raise ValueError(
            f"attend: the kernel refused heads={heads}, kv_heads={kv_heads}, dim={dim}, "
            f"block_size={block_size}, rows {rows.tolist()}, lengths {lengths.tolist()} for "
            f"tables of {tables.shape[1]} blocks in a cache of {keys.shape[0]} rows "
            f"(status {status}); nothing was written"
        )
    return out


def _packed(t: torch.Tensor, batch: int, dim: int) -> torch.Tensor:
    """An angle table's rows as (B, dim), contiguous (a copy held here, not a temporary)."""
    return t.reshape(batch, dim).contiguous()


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
