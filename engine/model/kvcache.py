"""Per-rank KV cache addressed by slot: one fixed row of `max_seq_len` positions per sequence.

Layout per layer: k and v of shape (num_slots, max_seq_len, local_kv_heads, head_dim). A slot
is a sequence's whole lifetime; the scheduler owns which slot is free. Slots waste the unused
tail of each row (no paging) but make reads a plain slice and need no block table.
"""

from __future__ import annotations

import torch


class KVCache:
    """Keys and values of the rank's own kv heads, for every layer and slot."""

    def __init__(
        self,
        num_layers: int,
        num_slots: int,
        max_seq_len: int,
        local_kv_heads: int,
        head_dim: int,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        if num_slots <= 0:
            raise ValueError(f"num_slots: must be a positive integer, got {num_slots}")
        shape = (num_layers, num_slots, max_seq_len, local_kv_heads, head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.num_slots = num_slots
        self.max_seq_len = max_seq_len

    def check(self, slot: int, start_pos: int, length: int) -> None:
        """Reject an entry before any layer writes, so a bad request cannot half-update a slot."""
        if not 0 <= slot < self.num_slots:
            raise ValueError(f"slot: {slot} is outside [0, {self.num_slots})")
        if start_pos < 0 or start_pos + length > self.max_seq_len:
            raise ValueError(
                f"start_pos: positions {start_pos}..{start_pos + length} exceed "
                f"max_seq_len={self.max_seq_len}"
            )

    def check_copy(self, src_slot: int, dst_slot: int, length: int) -> None:
        """Reject a prefix copy before any slot changes (see `copy_prefix`)."""
        for name, slot in (("src_slot", src_slot), ("dst_slot", dst_slot)):
            if not 0 <= slot < self.num_slots:
                raise ValueError(f"{name}: {slot} is outside [0, {self.num_slots})")
        if src_slot == dst_slot:
            raise ValueError(f"dst_slot: {dst_slot} is the source slot itself")
        if not 0 < length <= self.max_seq_len:
            raise ValueError(f"length: {length} is outside [1, {self.max_seq_len}]")

    def copy_prefix(self, src_slot: int, dst_slot: int, length: int) -> None:
        """Copy positions 0..length of `src_slot` into `dst_slot`, every layer, keys and values:
        a request's other choices start from their parent's prompt instead of a prefill."""
        self.check_copy(src_slot, dst_slot, length)
        self.k[:, dst_slot, :length] = self.k[:, src_slot, :length]
        self.v[:, dst_slot, :length] = self.v[:, src_slot, :length]

    def write(
        self, layer: int, slot: int, start_pos: int, k: torch.Tensor, v: torch.Tensor
    ) -> None:
        """Store (T, kv_heads, head_dim) keys/values at positions start_pos..start_pos+T."""
        end = start_pos + k.shape[0]
        self.k[layer, slot, start_pos:end] = k
        self.v[layer, slot, start_pos:end] = v

    def write_read(
        self,
        layer: int,
        slots: torch.Tensor,
        positions: torch.Tensor,
        end: int,
        k: torch.Tensor,
        v: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A decode batch: one new (kv_heads, head_dim) key/value per slot at its position,
        then every slot's keys/values at 0..end (the longest's), (B, end, kv_heads, head_dim)
        (a gathered copy; positions past a slot's own are the caller's to mask)."""
        self.k[layer, slots, positions] = k
        self.v[layer, slots, positions] = v
        return self.k[layer, slots, :end], self.v[layer, slots, :end]

    def read(self, layer: int, slot: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys/values at positions 0..end (views, no copy)."""
        return self.k[layer, slot, :end], self.v[layer, slot, :end]
