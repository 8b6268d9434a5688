"""Compiling one C source with the host's compiler into a cache, once per version.

Shared by the gateway's native relay (gateway/relay/native) and the engine's GGUF kernels
(engine/model/kernels). The cached file's name carries a hash of the source, of the files it
includes (`depends`: headers, the other files of a unity build), of the flags, the compiler
and whatever else the caller says the build depends on (`salt`), so a changed source never
runs a stale binary. Each build goes to a temporary name renamed into place, so processes
starting together share one.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

COMPILE_TIMEOUT_S = 120.0


class BuildError(RuntimeError):
    """No compiler, or it failed: the message says which."""


def cache_root(env: str, name: str) -> Path:
    """$`env`, else $XDG_CACHE_HOME/unitgate/`name`, else ~/.cache/unitgate/`name`."""
    if explicit := os.environ.get(env):
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "unitgate" / name


def compiler(missing: str) -> str:
    """$CC (which must then exist), else the first of cc, gcc, clang on PATH; `missing` is
    the message when there is none."""
    if explicit := os.environ.get("CC"):
        if path := shutil.which(explicit):
            return path
        raise BuildError(f"CC={explicit!r} is not found on PATH")
    for name in ("cc", "gcc", "clang"):
        if path := shutil.which(name):
            return path
    raise BuildError(missing)


def cache_key(
    source: Path, flags: Sequence[str], cc: str, salt: str = "", depends: Sequence[Path] = ()
) -> str:
    """The hash in a build's name: of `source`, the files it includes (`depends`, each by its
    name and its content's hash), the flags, the compiler, the machine and `salt`."""
    key = hashlib.sha256(b"\0".join([source.read_bytes(), *map(str.encode, flags)]))
    for path in depends:
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        key.update(f"\0{path.name}\0{digest}".encode())
    key.update(f"{cc}\0{platform.machine()}\0{salt}".encode())
    return key.hexdigest()[:16]


def compile_cached(
    source: Path,
    flags: Sequence[str],
    cache: Path,
    stem: str,
    suffix: str,
    missing: str,
    salt: str = "",
    depends: Sequence[Path] = (),
) -> Path:
    """The compiled `source` in `cache` (`stem`-HASH`suffix`), compiling it if needed.

    `depends`: the files `source` includes, whose names and contents are in the hash too."""
    cc = compiler(missing)
    target = cache / f"{stem}-{cache_key(source, flags, cc, salt, depends)}{suffix}"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(dir=target.parent, suffix=".so.partial")
    os.close(fd)
    try:
        result = subprocess.run(
            [cc, *flags, "-o", partial, str(source)],
            capture_output=True,
            text=True,
            timeout=COMPILE_TIMEOUT_S,
            check=False,
        )
        if result.returncode != 0:
            raise BuildError(
                f"compiling {source.name} with {cc} failed (exit {result.returncode}):\n"
                f"{result.stderr.strip()}"
            )
        os.replace(partial, target)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return target
