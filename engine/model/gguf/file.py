"""One opened GGUF file: typed metadata by key and memory-mapped tensors by name.

The header is parsed here rather than with `gguf.GGUFReader` (the PyPI reader, not this
package): that reader builds a numpy view per element of every metadata array, which for
SmolLM2's 49,152 tokens and 48,900 merges is 3.6 s of each rank's start; this parser reads the
same header in about 0.1 s. Tensor data stays in one read-only memory map, so opening reads
no weights and a rank pages in only the bytes it slices. Dequantizing is `gguf`'s.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32

# GGUF value types -> struct formats (8: string and 9: array are read by hand)
_SCALARS = {
    0: "B",
    1: "b",
    2: "H",
    3: "h",
    4: "I",
    5: "i",
    6: "f",
    7: "?",
    10: "Q",
    11: "q",
    12: "d",
}
_STRING, _ARRAY = 8, 9
# Unquantized types the map exposes as typed arrays; all others as bytes per row
_TYPED = {
    GGMLQuantizationType.F32: np.float32,
    GGMLQuantizationType.F16: np.float16,
    GGMLQuantizationType.F64: np.float64,
    GGMLQuantizationType.I8: np.int8,
    GGMLQuantizationType.I16: np.int16,
    GGMLQuantizationType.I32: np.int32,
    GGMLQuantizationType.I64: np.int64,
}


@dataclass(frozen=True)
class Tensor:
    """`shape` in GGUF order (fastest dim first, so a matrix is [cols, rows]); `data` is a
    read-only view, (rows, cols) for typed tensors and (rows, bytes per row) for quantized."""

    name: str
    tensor_type: GGMLQuantizationType
    shape: tuple[int, ...]
    data: np.ndarray


class GGUFFile:
    """Metadata accessors raise ValueError naming the key, so a file missing something says
    what, instead of failing later on a None."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise ValueError(f"model: {str(self.path)!r} is not a file")
        with self.path.open("rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            self.metadata, self.tensors = _parse(self._map)
        except (ValueError, struct.error, UnicodeDecodeError) as e:
            raise ValueError(f"model: {str(self.path)!r} is not a readable GGUF file: {e}") from e

    def get(self, key: str) -> Any:
        """The value under `key` (a str, number, bool or list), or None when absent."""
        return self.metadata.get(key)

    def string(self, key: str, default: str | None = None) -> str:
        return str(self._typed(key, str, default))

    def integer(self, key: str, default: int | None = None) -> int:
        return int(self._typed(key, int, default))

    def number(self, key: str, default: float | None = None) -> float:
        return float(self._typed(key, float, default))

    def strings(self, key: str) -> list[str]:
        value: list[str] = self._typed(key, list, None)
        if not all(isinstance(v, str) for v in value):
            raise ValueError(f"{key}: expected a list of strings in {self.path.name}")
        return value

    def _typed(self, key: str, kind: type[Any], default: Any) -> Any:
        value = self.get(key)
        if value is None:
            if default is None:
                raise ValueError(f"{key}: missing from {self.path.name}")
            return default
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if (kind is float and not number) or (kind is not float and not isinstance(value, kind)):
            raise ValueError(f"{key}: expected {kind.__name__}, got {value!r}")
        return value


class _Cursor:
    """Little-endian reads from the header, front to back."""

    def __init__(self, buffer: mmap.mmap) -> None:
        self.buffer, self.offset = buffer, 0

    def scalar(self, fmt: str) -> Any:
        (value,) = struct.unpack_from("<" + fmt, self.buffer, self.offset)
        self.offset += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        size = self.scalar("Q")
        start, self.offset = self.offset, self.offset + size
        return self.buffer[start : self.offset].decode("utf-8")

    def value(self, kind: int) -> Any:
        if kind in _SCALARS:
            return self.scalar(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item, count = self.scalar("I"), self.scalar("Q")
            if item in _SCALARS:  # one unpack for the whole array
                fmt = f"<{count}{_SCALARS[item]}"
                values = list(struct.unpack_from(fmt, self.buffer, self.offset))
                self.offset += struct.calcsize(fmt)
                return values
            return [self.value(item) for _ in range(count)]
        raise ValueError(f"unknown metadata value type {kind}")


def _parse(buffer: mmap.mmap) -> tuple[dict[str, Any], dict[str, Tensor]]:
    cursor = _Cursor(buffer)
    if buffer[:4] != MAGIC:
        raise ValueError("no GGUF magic")
    cursor.offset = 4
    version = cursor.scalar("I")
    if version not in (2, 3):
        raise ValueError(f"GGUF version {version} (2 and 3 are read, little-endian)")
    tensor_count, kv_count = cursor.scalar("Q"), cursor.scalar("Q")
    metadata: dict[str, Any] = {}
    for _ in range(kv_count):
        key = cursor.string()
        metadata[key] = cursor.value(cursor.scalar("I"))
    infos = []
    for _ in range(tensor_count):
        name = cursor.string()
        dims = tuple(cursor.scalar("Q") for _ in range(cursor.scalar("I")))
        infos.append((name, GGMLQuantizationType(cursor.scalar("I")), dims, cursor.scalar("Q")))
    alignment = int(metadata.get("general.alignment", DEFAULT_ALIGNMENT))
    start = -(-cursor.offset // alignment) * alignment
    whole = np.frombuffer(buffer, dtype=np.uint8)
    tensors = {
        name: _tensor(whole, start + offset, name, kind, dims) for name, kind, dims, offset in infos
    }
    return metadata, tensors


def _tensor(
    whole: np.ndarray, offset: int, name: str, kind: GGMLQuantizationType, dims: tuple[int, ...]
) -> Tensor:
    rows = tuple(reversed(dims))  # numpy order: slowest dim first
    block, size = GGML_QUANT_SIZES[kind]
    if dims[0] % block:
        raise ValueError(f"{name}: rows of {dims[0]} are not whole blocks of {block}")
    count = int(np.prod(dims)) * size // block
    data = whole[offset : offset + count]
    if kind in _TYPED:
        view = data.view(_TYPED[kind]).reshape(rows)
    else:
        view = data.reshape((*rows[:-1], dims[0] // block * size))
    return Tensor(name, kind, dims, view)
