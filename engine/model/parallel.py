"""Tensor parallelism: the rank's view of the group and the layers that split across it.

Column-parallel layers split output features (each rank computes some heads or MLP features);
row-parallel layers split input features and all-reduce their partial sums. Each layer reads
only its own shard from a `WeightSource`, so a rank never materialises another rank's weights.

Attention splits by KV-head groups (a KV head and the query heads that share it stay on one
rank), unevenly when the count does not divide: 3 KV heads over 2 ranks are 2 + 1 groups. The
MLP splits evenly. Either way a shard is a contiguous slice, so the all-reduce sums the same
terms in the same places as TP=1.

Vocabulary: the embedding and the LM head are REPLICATED on every rank. Every rank then holds
complete logits without a gather, the vocab size needs no divisibility by the world size, and
TP adds exactly two all-reduces per layer. The price is vocab x hidden memory per rank (about
1 GB for a 128k x 4k bf16 head); sharding the head along the vocab and all-gathering would be
a change to `ReplicatedLinear`'s one caller.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch
import torch.distributed as dist
from torch import nn

from engine.model import blocks, narrow


class WeightSource(Protocol):
    """Where weights come from (a seeded generator, a safetensors folder), by HF name."""

    def get(self, name: str, rows: slice | None = None, cols: slice | None = None) -> torch.Tensor:
        """The tensor `name`, restricted to `rows` (dim 0) and/or `cols` (dim 1)."""
        ...

    def has(self, name: str) -> bool: ...


@runtime_checkable
class BlockSource(WeightSource, Protocol):
    """A source that also hands out matrices as its file stores them (a GGUF's blocks)."""

    def blocks(
        self, name: str, rows: slice | None = None, cols: slice | None = None
    ) -> torch.Tensor:
        """The shard as bytes, (rows, bytes per row): see `engine.model.blocks`."""
        ...


@dataclass(frozen=True)
class TPContext:
    """This rank's place in the tensor-parallel group.

    `group=None` means the default (world) group; at world size 1 nothing is communicated.
    Shapes are validated from rank and world size alone, before any collective runs."""

    rank: int = 0
    world_size: int = 1
    group: dist.ProcessGroup | None = None

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise ValueError(f"world_size: must be >= 1, got {self.world_size}")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank: {self.rank} is outside [0, {self.world_size})")

    @classmethod
    def from_process_group(cls, group: dist.ProcessGroup | None = None) -> TPContext:
        """The context of an initialised torch.distributed group (default: the world)."""
        return cls(
            rank=dist.get_rank(group),
            world_size=dist.get_world_size(group),
            group=group if group is not None else dist.group.WORLD,
        )

    def shard(self, size: int, what: str) -> slice:
        """This rank's contiguous slice of `size` items; `what` names them in the error."""
        if size % self.world_size:
            raise ValueError(
                f"{what}: {size} is not divisible by tensor-parallel world_size={self.world_size}"
            )
        part = size // self.world_size
        return slice(self.rank * part, (self.rank + 1) * part)

    def split(self, count: int, what: str) -> slice:
        """This rank's contiguous share of `count` items that need not divide evenly: the
        first `count % world_size` ranks take one more. Every rank must get at least one
        (a rank with no KV head would have nothing to attend with)."""
        if count < self.world_size:
            raise ValueError(
                f"{what}: {count} cannot be split over tensor-parallel "
                f"world_size={self.world_size} (each rank needs at least one)"
            )
        base, extra = divmod(count, self.world_size)
        start = self.rank * base + min(self.rank, extra)
        return slice(start, start + base + (self.rank < extra))

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum partial results across ranks in place (a no-op at world size 1)."""
        if self.world_size > 1:
            dist.all_reduce(x, op=dist.ReduceOp.SUM, group=self.group)
        return x


def _empty(rows: int, cols: int) -> nn.Parameter:
    return nn.Parameter(torch.empty(rows, cols), requires_grad=False)


def _read(
    source: WeightSource,
    name: str,
    weight: torch.Tensor,
    rows: slice | None = None,
    cols: slice | None = None,
) -> torch.Tensor:
    """`name`'s shard as `weight` stores it: values, or the file's blocks when `weight` is
    a BLOCKS placeholder (its shape is the file's to decide, so nothing is preallocated)."""
    if weight.dtype != blocks.BLOCKS:
        return source.get(name, rows=rows, cols=cols)
    if not isinstance(source, BlockSource):
        raise ValueError(
            "weight_dtype: 'gguf' keeps a GGUF file's quantized blocks, and this model's "
            "weights do not come from a GGUF file"
        )
    return source.blocks(name, rows=rows, cols=cols)


def _store(module: nn.Module, value: torch.Tensor) -> None:
    """Into the preallocated weight (no second copy of it), or as the weight (blocks)."""
    weight = module.weight
    assert isinstance(weight, torch.Tensor)
    if weight.dtype == blocks.BLOCKS:
        module.weight = nn.Parameter(value.contiguous(), requires_grad=False)
    else:
        weight.copy_(value)


def _scaled(items: slice, size: int) -> slice:
    """A slice of items (heads, say) as a slice of the features they own."""
    return slice(items.start * size, items.stop * size)


class ColumnParallelLinear(nn.Module):
    """y[:, shard] = x @ W[shard].T: the rank keeps the rows (output features) of its shard.

    One layer stacks the matrices that read the same input (q, k and v; gate and up), so a
    step runs one matmul where it would run three, and returns their outputs apart. `parts`
    maps each matrix's HF name to its shard in items of a size (heads of head_dim, or single
    MLP features), as `TPContext.shard` or `TPContext.split` gave it."""

    def __init__(self, in_features: int, parts: Mapping[str, tuple[slice, int]]) -> None:
        super().__init__()
        self.rows = {name: _scaled(items, size) for name, (items, size) in parts.items()}
        self.sizes = [rows.stop - rows.start for rows in self.rows.values()]
        self.weight = _empty(sum(self.sizes), in_features)

    def load(self, source: WeightSource, prefix: str) -> None:
        """Each part from `{prefix}.{name}.weight`, stacked in order."""
        if self.weight.dtype == blocks.BLOCKS:
            parts = [
                _read(source, f"{prefix}.{n}.weight", self.weight, r) for n, r in self.rows.items()
            ]
            _store(self, torch.cat(parts))
            return
        offset = 0
        for (name, rows), size in zip(self.rows.items(), self.sizes, strict=True):
            part = source.get(f"{prefix}.{name}.weight", rows=rows)
            self.weight[offset : offset + size].copy_(part)
            offset += size

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return torch.split(self.stacked(x), self.sizes, dim=-1)

    def stacked(self, x: torch.Tensor) -> torch.Tensor:
        """The parts' outputs side by side, (tokens, sum of sizes), for a caller that splits
        them its own way."""
        return narrow.linear(x, self.weight)


class RowParallelLinear(nn.Module):
    """y = sum over ranks of x[:, shard] @ W[:, shard].T: inputs split, outputs all-reduced."""

    def __init__(self, cols: slice, out_features: int, tp: TPContext, item_size: int = 1) -> None:
        super().__init__()
        self.tp = tp
        self.cols = _scaled(cols, item_size)
        self.weight = _empty(out_features, self.cols.stop - self.cols.start)

    def load(self, source: WeightSource, name: str) -> None:
        _store(self, _read(source, name, self.weight, cols=self.cols))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.tp.all_reduce(narrow.linear(x, self.weight))


class ReplicatedLinear(nn.Module):
    """The LM head: the full matrix on every rank (see the module docstring for why)."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.weight = _empty(out_features, in_features)

    def load(self, source: WeightSource, name: str) -> None:
        _store(self, _read(source, name, self.weight))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return narrow.linear(x, self.weight)


class ReplicatedEmbedding(nn.Module):
    """The token embedding, whole on every rank, so each rank embeds its inputs locally."""

    def __init__(self, vocab_size: int, hidden_size: int) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.weight = _empty(vocab_size, hidden_size)

    def load(self, source: WeightSource, name: str) -> None:
        _store(self, _read(source, name, self.weight))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.weight.dtype == blocks.BLOCKS:
            return blocks.dequantize(self.weight, self.hidden_size, ids)
        return nn.functional.embedding(ids, self.weight)
