"""The engine's C kernels, compiled on first use with the host's C compiler and cached: the
matrices kept in a GGUF file's blocks (`blocks.c`, `engine.model.blocks`), and the optional
ones of a decode step, attention over the paged KV cache (`attention.c`,
`engine.model.decode_attention`) and RMSNorm with its residual add (`norm.c`). Each is its
own library: a machine without a compiler loses the first only with `weight_dtype = "gguf"`,
and the optional ones fall back to torch.

Why compiled here and not at install: the flags depend on the CPU that runs them (the AVX2
and AVX-512 paths are picked at run time, but the compiler must know the targets), a source
change must never run a stale binary, and an editable install builds nothing. The cache is
keyed by the source, the flags and the compiler, so each version is compiled once per machine
(about 1 s) and ranks that start together share it (gateway/base/cbuild.py, which the
gateway's native relay uses too).

Plain C behind ctypes rather than a torch extension: no torch headers (a torch extension
takes about a minute to compile), no ABI tie to the torch version, and ctypes releases the GIL
for the call.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Sequence
from pathlib import Path

from gateway.base.cbuild import BuildError, cache_root, compile_cached

SOURCE = Path(__file__).with_name("blocks.c")
SIMD = Path(__file__).with_name("simd.h")  # included by every source
FLAGS = ("-O3", "-shared", "-fPIC", "-std=c11", "-ffp-contract=off")

_I64, _PTR, _INT = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
_ATTEND = [_I64, _I64, _I64, _I64, _PTR, _I64, _PTR, _I64, _PTR, _I64, _PTR, _PTR, _PTR, _I64]
_ATTEND += [_PTR, _PTR, _PTR, _I64, _PTR, _I64, ctypes.c_float, _PTR]
_NORM = [_PTR, _PTR, _PTR, _PTR, _I64, _I64, ctypes.c_float, _PTR]
Signatures = dict[str, tuple[Sequence[type], type | None]]
# The optional kernels: name -> (source, {function: (argument types, result type)}).
OPTIONAL: dict[str, tuple[Path, Signatures]] = {
    "attention": (
        Path(__file__).with_name("attention.c"),
        {
            "ug_attend_decode": (_ATTEND, _INT),
            "ug_attend_decode_portable": (_ATTEND, _INT),
            "ug_attend_accelerated": ([_I64], _INT),
        },
    ),
    "norm": (
        Path(__file__).with_name("norm.c"),
        {
            "ug_rms_norm": (_NORM, None),
            "ug_rms_norm_portable": (_NORM, None),
            "ug_norm_accelerated": ([_I64], _INT),
        },
    ),
}


class KernelUnavailable(RuntimeError):
    """No C compiler, or it failed: the message says which and what to do instead."""


def cache_dir() -> Path:
    """$UNITGATE_KERNEL_CACHE, else $XDG_CACHE_HOME/unitgate/kernels, else ~/.cache/..."""
    return cache_root("UNITGATE_KERNEL_CACHE", "kernels")


def build() -> Path:
    """The block kernels' compiled library, compiling it if this machine has not yet."""
    missing = (
        "weight_dtype 'gguf' needs a C compiler to build its kernel, and none was found "
        "(install gcc or set CC; weight_dtype 'float16' or 'float32' need none)"
    )
    return _build(SOURCE, "blocks", missing)


def build_optional(name: str) -> Path:
    """One of the `OPTIONAL` kernels' compiled library, compiling it if needed."""
    missing = f"no C compiler was found for the {name} kernel (install gcc or set CC)"
    return _build(OPTIONAL[name][0], name, missing)


def _build(source: Path, stem: str, missing: str) -> Path:
    try:
        return compile_cached(source, FLAGS, cache_dir(), stem, ".so", missing, depends=(SIMD,))
    except BuildError as exc:
        raise KernelUnavailable(str(exc)) from None


@functools.cache
def library() -> ctypes.CDLL:
    """The loaded kernels, built on the first call in this process."""
    lib = ctypes.CDLL(str(build()))
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    for name in ("ug_matmul", "ug_matmul_avx2", "ug_matmul_portable"):
        getattr(lib, name).argtypes = [ctypes.c_int, ptr, i64, i64, ptr, i64, ptr]
        getattr(lib, name).restype = None
    for name in ("ug_dequant", "ug_dequant_portable"):
        getattr(lib, name).argtypes = [ctypes.c_int, ptr, i64, ptr, i64, ptr]
        getattr(lib, name).restype = None
    for name in ("ug_accelerated", "ug_wide"):
        getattr(lib, name).argtypes = []
        getattr(lib, name).restype = ctypes.c_int
    return lib


@functools.cache
def optional_library(name: str) -> ctypes.CDLL:
    """One of the `OPTIONAL` kernels, loaded (built on the first call in this process)."""
    lib = ctypes.CDLL(str(build_optional(name)))
    for function, (arguments, result) in OPTIONAL[name][1].items():
        getattr(lib, function).argtypes = arguments
        getattr(lib, function).restype = result
    return lib


@functools.cache
def builds(name: str) -> bool:
    """Whether the `OPTIONAL` kernel `name` builds and loads here (asked once a process)."""
    try:
        optional_library(name)
    except KernelUnavailable:
        return False
    return True
