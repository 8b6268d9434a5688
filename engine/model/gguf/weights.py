"""A GGUF's tensors as a WeightSource: HF names in, this rank's shard out as float32.

Each request is sliced in the file's own layout first and dequantized after, so a rank
decodes only its own rows (column-parallel) or its own column blocks (row-parallel) and never
holds another rank's matrix in float32. Quantized rows are runs of blocks (32 values for
Q4_1 and Q8_0); a column range on block boundaries (head_dim and the MLP shards of the
models here are multiples of 32) is a plain byte range of each row, anything else is widened
to whole blocks and trimmed after decoding.

llama.cpp stores attn_q and attn_k with each head's rows interleaved for its rotary kernel
(pairs (i, i + head_dim/2) made adjacent); transformers' GGUF loader undoes that, and so does
`_unpermute`, per head, which is why a shard of whole heads can be undone on its own.

`blocks` hands out the same shards undecoded (`weight_dtype = "gguf"`): rows of the file's
bytes, unpermuted the same way (a row is whole blocks), columns only on block boundaries.
"""

from __future__ import annotations

import re

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES
from gguf.quants import dequantize

from engine.model.blocks import FORMATS
from engine.model.gguf.file import GGUFFile, Tensor

_GLOBAL = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
_LAYER = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
_LAYER_NAME = re.compile(r"model\.layers\.(\d+)\.(.+)\.weight")
_ROTARY = ("attn_q", "attn_k")


def gguf_name(name: str) -> str:
    """The GGUF tensor name of a Hugging Face Llama tensor name."""
    if name in _GLOBAL:
        return _GLOBAL[name]
    match = _LAYER_NAME.fullmatch(name)
    if match is None or match.group(2) not in _LAYER:
        raise KeyError(f"weights: no GGUF tensor for {name!r}")
    return f"blk.{match.group(1)}.{_LAYER[match.group(2)]}.weight"


class GGUFSource:
    """Hands out tensors of a Llama GGUF by HF name, in the HF layout the transformer expects."""

    def __init__(self, file: GGUFFile, head_dim: int) -> None:
        self.file, self.head_dim = file, head_dim

    def has(self, name: str) -> bool:
        return gguf_name(name) in self.file.tensors

    def _tensor(self, name: str) -> tuple[str, Tensor]:
        key = gguf_name(name)
        tensor = self.file.tensors.get(key)
        if tensor is None:
            raise KeyError(f"weights: {key!r} (for {name!r}) not found in {self.file.path.name}")
        return key, tensor

    def blocks(
        self, name: str, rows: slice | None = None, cols: slice | None = None
    ) -> torch.Tensor:
        """The shard as the file stores it: uint8 (rows, bytes per row), see engine.model.blocks."""
        key, tensor = self._tensor(name)
        kind = tensor.tensor_type.name
        if kind not in FORMATS:
            raise ValueError(
                f"weights: {key} is {kind}; weight_dtype 'gguf' multiplies "
                f"{' and '.join(FORMATS)} blocks (use 'float16' or 'float32' for this file)"
            )
        data: np.ndarray = tensor.data if rows is None else tensor.data[rows]
        if cols is not None:
            start, stop, _ = cols.indices(int(tensor.shape[0]))
            byte_range, values = _blocks_covering(tensor, start, stop)
            if values != (start, stop):
                block = GGML_QUANT_SIZES[tensor.tensor_type][0]
                raise ValueError(
                    f"weights: columns {start}:{stop} of {key} do not fall on its {block}-value "
                    f"blocks, so this shard cannot stay in blocks (use weight_dtype 'float16')"
                )
            data = data[:, byte_range]
        if key.split(".")[-2] in _ROTARY:
            data = _unpermute(data, self.head_dim, rows)
        return torch.from_numpy(np.ascontiguousarray(data).copy())

    def get(self, name: str, rows: slice | None = None, cols: slice | None = None) -> torch.Tensor:
        key, tensor = self._tensor(name)
        data: np.ndarray = tensor.data
        if rows is not None:
            data = data[rows]  # a view of the memory map: nothing read yet
        values = _decode_columns(tensor, data, cols) if data.ndim == 2 else _decode(tensor, data)
        if key.split(".")[-2] in _ROTARY:
            values = _unpermute(values, self.head_dim, rows)
        # A copy where the values are still the read-only memory map (F32 norms).
        return torch.from_numpy(np.require(values, np.float32, ["C", "W"]))


def _decode(tensor: Tensor, data: np.ndarray) -> np.ndarray:
    decoded: np.ndarray = dequantize(np.asarray(data), tensor.tensor_type)
    return decoded


def _decode_columns(tensor: Tensor, data: np.ndarray, cols: slice | None) -> np.ndarray:
    """Dequantize `data`'s rows, restricted to columns `cols` (None: all) before decoding."""
    if cols is None:
        return _decode(tensor, data)
    start, stop, _ = cols.indices(int(tensor.shape[0]))
    if data.dtype != np.uint8:  # stored unquantized (F32, F16): one item per value
        return _decode(tensor, data[:, start:stop])
    byte_range, (offset, _) = _blocks_covering(tensor, start, stop)
    decoded = _decode(tensor, data[:, byte_range])
    return decoded[:, start - offset : stop - offset]


def _blocks_covering(tensor: Tensor, start: int, stop: int) -> tuple[slice, tuple[int, int]]:
    """The quantized blocks holding values [start, stop) of each row: their bytes within
    the row, and the values they hold (wider than asked where the range cuts a block)."""
    block, size = GGML_QUANT_SIZES[tensor.tensor_type]
    first, last = start // block, -(-stop // block)
    return slice(first * size, last * size), (first * block, last * block)


def _unpermute(w: np.ndarray, head_dim: int, rows: slice | None) -> np.ndarray:
    """Undo llama.cpp's rotary row order within each head (whole heads only)."""
    if rows is not None and (rows.start or 0) % head_dim:
        raise ValueError(f"weights: a q/k shard must start on a head, got rows {rows}")
    if w.shape[0] % head_dim:
        raise ValueError(f"weights: {w.shape[0]} q/k rows are not whole heads of {head_dim}")
    heads = w.shape[0] // head_dim
    return w.reshape(heads, head_dim // 2, 2, -1).swapaxes(1, 2).reshape(w.shape)
