"""Per-rank paged KV cache: blocks of `block_size` positions, a block table per slot.

Layout per layer: k and v of shape (num_blocks * block_size, local_kv_heads, head_dim), one
row per cached position; block b holds rows b * block_size .. (b + 1) * block_size. Position
p of the sequence in slot s lives in block `tables[s][p // block_size]`, at offset
`p % block_size`, so sequences can share the blocks of a common prefix (the prefix cache,
`engine.prefixcache`, decides which; this module only stores and reads).

Until the runtime gives a slot its table (`set_tables`), slot s owns the blocks
s * max_blocks .. (s + 1) * max_blocks: a plain row per slot, as a cache without paging, so
a model driven directly by (slot, ids, start) entries needs no block bookkeeping.

Reads of a slot whose blocks follow each other are views (no copy); others gather.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from typing import NamedTuple

import torch

from engine.prefixcache.pool import DEFAULT_BLOCK_SIZE, BlockCopy, TableEdit, blocks_for

Rows = slice | torch.Tensor  # flat row indices: a range (a view), or gathered


class Span(NamedTuple):
    """One multi-position entry of a step: its first position, its length, and the rows it
    writes and reads (0..start + length), planned once for every layer."""

    start: int
    length: int
    write: Rows
    read: Rows


class KVCache:
    """Keys and values of the rank's own kv heads, for every layer and block."""

    def __init__(
        self,
        num_layers: int,
        num_slots: int,
        max_seq_len: int,
        local_kv_heads: int,
        head_dim: int,
        device: torch.device,
        dtype: torch.dtype,
        *,
        block_size: int = DEFAULT_BLOCK_SIZE,
        num_blocks: int | None = None,
    ) -> None:
        """`num_blocks`: at least `num_slots` full sequences' worth (the default), so a slot
        that runs can always grow; more is room for cached prefixes."""
        if num_slots <= 0:
            raise ValueError(f"num_slots: must be a positive integer, got {num_slots}")
        if block_size <= 0:
            raise ValueError(f"block_size: must be a positive integer, got {block_size}")
        self.max_blocks = blocks_for(max_seq_len, block_size)
        least = num_slots * self.max_blocks
        num_blocks = least if num_blocks is None else num_blocks
        if num_blocks < least:
            raise ValueError(
                f"num_blocks: {num_blocks} is fewer than {num_slots} slots of "
                f"{self.max_blocks} blocks ({least}) need"
            )
        shape = (num_layers, num_blocks * block_size, local_kv_heads, head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.num_slots, self.max_seq_len = num_slots, max_seq_len
        self.block_size, self.num_blocks = block_size, num_blocks
        # The same tables twice: Python lists to plan with, a tensor to gather decodes with.
        self._tables = [
            list(range(s * self.max_blocks, (s + 1) * self.max_blocks)) for s in range(num_slots)
        ]
        self.tables = torch.tensor(self._tables, dtype=torch.int64, device=device)

    # --- tables and copies (every rank applies a step's, in the leader's order) -----------

    @contextlib.contextmanager
    def stepping(
        self,
        tables: Sequence[tuple[int, int, Sequence[int]]],
        copies: Sequence[Sequence[int]],
    ) -> Iterator[None]:
        """Around a step's forward, as every rank runs it: the table edits before it (where
        its entries' positions live), the block copies after it (from the blocks it wrote).
        A forward that raises makes no copy."""
        if tables:
            self.set_tables(tables)
        yield
        if copies:
            self.copy_blocks(copies)

    def set_tables(self, edits: Iterable[tuple[int, int, Sequence[int]]]) -> None:
        """Apply table edits, all checked first: a bad one raises before any table changes."""
        checked = [self._check_edit(*edit) for edit in edits]
        for slot, first, blocks in checked:
            end = first + len(blocks)
            self._tables[slot][first:end] = blocks
            self.tables[slot, first:end] = torch.tensor(blocks, dtype=torch.int64)

    def _check_edit(self, slot: int, first: int, blocks: Sequence[int]) -> TableEdit:
        if not 0 <= slot < self.num_slots:
            raise ValueError(f"slot: {slot} is outside [0, {self.num_slots})")
        if first < 0 or first + len(blocks) > self.max_blocks:
            raise ValueError(
                f"table: entries {first}..{first + len(blocks)} exceed {self.max_blocks} blocks"
            )
        if blocks and not (min(blocks) >= 0 and max(blocks) < self.num_blocks):
            raise ValueError(f"block: ids must be in [0, {self.num_blocks}), got {list(blocks)}")
        return TableEdit(slot, first, tuple(blocks))

    def table(self, slot: int) -> tuple[int, ...]:
        return tuple(self._tables[slot])

    def copy_blocks(self, copies: Iterable[Sequence[int]]) -> None:
        """Copy (src, dst, length) block prefixes in order; all are checked first."""
        checked = [BlockCopy(*copy) for copy in copies]
        for src, dst, length in checked:
            for name, block in (("src", src), ("dst", dst)):
                if not 0 <= block < self.num_blocks:
                    raise ValueError(f"{name}: block {block} is outside [0, {self.num_blocks})")
            if src == dst:
                raise ValueError(f"dst: block {dst} is the source block itself")
            if not 0 < length <= self.block_size:
                raise ValueError(f"length: {length} is outside [1, {self.block_size}]")
        size = self.block_size
        for src, dst, length in checked:
            self.k[:, dst * size : dst * size + length] = self.k[
                :, src * size : src * size + length
            ]
            self.v[:, dst * size : dst * size + length] = self.v[
                :, src * size : src * size + length
            ]

    # --- a step's plan ---------------------------------------------------------------------

    def check(self, slot: int, start_pos: int, length: int) -> None:
        """Reject an entry before any layer writes, so a bad request cannot half-update a slot."""
        if not 0 <= slot < self.num_slots:
            raise ValueError(f"slot: {slot} is outside [0, {self.num_slots})")
        if start_pos < 0 or start_pos + length > self.max_seq_len:
            raise ValueError(
                f"start_pos: positions {start_pos}..{start_pos + length} exceed "
                f"max_seq_len={self.max_seq_len}"
            )

    def span(self, slot: int, start: int, length: int) -> Span:
        """The rows an entry writes (start..start+length) and reads (0..start+length)."""
        end, size = start + length, self.block_size
        blocks = self._tables[slot][: blocks_for(end, size)]
        first = blocks[0]
        if blocks[-1] - first == len(blocks) - 1 and blocks == list(
            range(first, first + len(blocks))
        ):
            base = first * size
            return Span(start, length, slice(base + start, base + end), slice(base, base + end))
        table = torch.tensor(blocks, dtype=torch.int64, device=self.k.device)
        rows = (table[:, None] * size + torch.arange(size, device=self.k.device)).flatten()[:end]
        return Span(start, length, rows[start:], rows)

    def decode_rows(
        self, slots: Sequence[int], positions: Sequence[int], seen: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """For single-token entries: the row each writes (B,), and the blocks each reads up
        to `seen` positions (B, blocks); a shorter sequence's extra blocks are the caller's
        to mask."""
        size, tables = self.block_size, self._tables
        write = [
            tables[s][p // size] * size + p % size for s, p in zip(slots, positions, strict=True)
        ]
        index = torch.tensor(slots, dtype=torch.int64, device=self.k.device)
        return (
            torch.tensor(write, dtype=torch.int64, device=self.k.device),
            self.tables[index, : blocks_for(seen, size)],
        )

    # --- one layer -------------------------------------------------------------------------

    def write(self, layer: int, rows: Rows, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store (T, kv_heads, head_dim) keys/values at `rows`."""
        self.k[layer, rows] = k
        self.v[layer, rows] = v

    def layer(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One layer's keys and values, (rows, kv_heads, head_dim) each: views, not copies."""
        return self.k[layer], self.v[layer]

    def read(self, layer: int, rows: Rows) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys/values at `rows` (a view for a range, a gathered copy otherwise)."""
        return self.k[layer, rows], self.v[layer, rows]

    def write_read(
        self,
        layer: int,
        rows: torch.Tensor,
        blocks: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A decode batch: one new (kv_heads, head_dim) key/value per entry at its row, then
        every entry's blocks (B, blocks * block_size, kv_heads, head_dim), gathered."""
        self.k[layer, rows] = k
        self.v[layer, rows] = v
        b, n = blocks.shape
        shape = (b, n * self.block_size, *self.k.shape[2:])
        paged = (-1, self.block_size, *self.k.shape[2:])
        # index_select on the flat block list: one copy per block, where indexing by the
        # (B, blocks) table costs several times as much per element.
        flat = blocks.reshape(-1)
        keys = self.k[layer].view(paged).index_select(0, flat).view(shape)
        values = self.v[layer].view(paged).index_select(0, flat).view(shape)
        return keys, values
