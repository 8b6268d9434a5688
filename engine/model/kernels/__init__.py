"""The engine's C kernels, compiled on first use with the host's C compiler and cached.

Why compiled here and not at install: the flags depend on the CPU that runs them (the AVX2
path is picked at run time, but the compiler must know the target), a source change must never
run a stale binary, and an editable install builds nothing. The cache is keyed by the source,
the flags and the compiler, so each version is compiled once per machine (about 1 s) and ranks
that start together share it: each compiles to a temporary name and renames atomically.

Plain C behind ctypes rather than a torch extension: no torch headers (a torch extension
takes about a minute to compile), no ABI tie to the torch version, and ctypes releases the GIL
for the call.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

SOURCE = Path(__file__).with_name("blocks.c")
FLAGS = ("-O3", "-shared", "-fPIC", "-std=c11", "-ffp-contract=off")
COMPILE_TIMEOUT_S = 120.0


class KernelUnavailable(RuntimeError):
    """No C compiler, or it failed: the message says which and what to do instead."""


def cache_dir() -> Path:
    """$UNITGATE_KERNEL_CACHE, else $XDG_CACHE_HOME/unitgate/kernels, else ~/.cache/..."""
    if explicit := os.environ.get("UNITGATE_KERNEL_CACHE"):
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "unitgate" / "kernels"


def compiler() -> str:
    """$CC (which must then exist), else the first of cc, gcc, clang on PATH."""
    if explicit := os.environ.get("CC"):
        if path := shutil.which(explicit):
            return path
        raise KernelUnavailable(f"CC={explicit!r} is not found on PATH")
    for name in ("cc", "gcc", "clang"):
        if path := shutil.which(name):
            return path
    raise KernelUnavailable(
        "weight_dtype 'gguf' needs a C compiler to build its kernel, and none was found "
        "(install gcc or set CC; weight_dtype 'float16' or 'float32' need none)"
    )


def build() -> Path:
    """The compiled library's path, compiling it if this machine has not yet."""
    cc = compiler()
    source = SOURCE.read_bytes()
    key = hashlib.sha256(b"\0".join([source, *map(str.encode, FLAGS), cc.encode()]))
    key.update(platform.machine().encode())
    target = cache_dir() / f"blocks-{key.hexdigest()[:16]}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(dir=target.parent, suffix=".so.partial")
    os.close(fd)
    try:
        result = subprocess.run(
            [cc, *FLAGS, "-o", partial, str(SOURCE)],
            capture_output=True,
            text=True,
            timeout=COMPILE_TIMEOUT_S,
            check=False,
        )
        if result.returncode != 0:
            raise KernelUnavailable(
                f"compiling {SOURCE.name} with {cc} failed (exit {result.returncode}):\n"
                f"{result.stderr.strip()}"
            )
        os.replace(partial, target)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return target


@functools.cache
def library() -> ctypes.CDLL:
    """The loaded kernels, built on the first call in this process."""
    lib = ctypes.CDLL(str(build()))
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    for name in ("ug_matmul", "ug_matmul_portable"):
        getattr(lib, name).argtypes = [ctypes.c_int, ptr, i64, i64, ptr, i64, ptr]
        getattr(lib, name).restype = None
    for name in ("ug_dequant", "ug_dequant_portable"):
        getattr(lib, name).argtypes = [ctypes.c_int, ptr, i64, ptr, i64, ptr]
        getattr(lib, name).restype = None
    lib.ug_accelerated.argtypes = []
    lib.ug_accelerated.restype = ctypes.c_int
    return lib
