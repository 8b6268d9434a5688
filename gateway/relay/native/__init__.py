"""The relay's compiled per-read call (relay.c), built with the host's C compiler and cached.

Built at set-up (`make run`, `make test` and the Dockerfile run `python -m
gateway.relay.native`) and otherwise on first use, like the engine's GGUF kernels: the cache is
keyed by the sources (every .c and .h file here), the flags, the compiler and the Python it is
built for, so a change to any of them never runs a stale binary and each version compiles once
per machine (about 2 s). Each build goes to a temporary name renamed into place, so processes
starting together share it.

The C is in several files, split where its work divides (relay.c says which holds what), and
compiled as one unity build: relay.c includes relay.h and then the others, and the compiler
gets relay.c alone. So every function stays `static`, as it was in one file: the compiler
still inlines the per-read helpers across the files (the machine code is the one file's), the
built module exports PyInit__relay alone (no name of a helper can clash with another
library's), and the build is still one compiler call on one source. Compiling the files
separately would need an exported symbol per shared function, or link-time optimisation to
inline them as before.

The module's types are in _relay.pyi (`module()` gives it typed as `Relay`), and the attributes
of the Python objects its C reads and writes, by name, in contract.py.

Which relay a gateway uses is `[upstream] relay` ("auto", "native" or "python"), overridden
by the environment variable UNITGATE_RELAY (the test suite runs once with each). "auto" takes
the native one when it builds and says so in the log when it does not; "native" refuses to
start without it. The Python relay (gateway/relay/pump.py with httptools and tracker.py) is
the reference the native one is tested against.
"""

from __future__ import annotations

import functools
import importlib.machinery
import importlib.util
import subprocess
import sysconfig
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, cast

from gateway.base.cbuild import BuildError, cache_root, compile_cached
from gateway.config.proxy import RELAYS
from gateway.envchoice import env_choice

if TYPE_CHECKING:
    from gateway.relay.native import _relay

NAME = "gateway.relay.native._relay"  # as relay.c names its module
# The translation unit: it includes the other sources (`parts`).
SOURCE = Path(__file__).with_name("relay.c")
FLAGS = (
    "-O2",
    "-shared",
    "-fPIC",
    "-std=c11",
    "-Wall",
    "-Wextra",
    "-Werror",
    "-Wno-unused-parameter",
    "-Wno-missing-field-initializers",
    "-fno-strict-aliasing",
)
ENV = "UNITGATE_RELAY"


class Relay(ModuleType):
    """The loaded module's type (`module()` gives it): its names, typed by _relay.pyi. A
    ModuleType, so that what takes one takes it."""

    Reader: type[_relay.Reader]
    Tap: type[_relay.Tap]
    request_head: Callable[[bytes], tuple[bytes, list[tuple[str, str]], int, bool] | None]
    response_head: Callable[[bytes, int], tuple[int, dict[bytes, bytes], bool] | None]
    GONE: int
    FAILED: int
    COMPLETE: int
    PAUSE: int
    BROKEN: int
    JUNK: int
    ENDED: int
    MAX_EVENT: int


class NativeUnavailable(RuntimeError):
    """No C compiler or no Python headers, or the build failed: the message says which."""


def cache_dir() -> Path:
    """$UNITGATE_NATIVE_CACHE, else $XDG_CACHE_HOME/unitgate/native, else ~/.cache/..."""
    return cache_root("UNITGATE_NATIVE_CACHE", "native")


def parts() -> list[Path]:
    """The sources beside SOURCE that it includes: every other .c and .h file in its folder."""
    return sorted(p for p in SOURCE.parent.iterdir() if p.suffix in {".c", ".h"} and p != SOURCE)


def build() -> Path:
    """The compiled module's path, compiling it if this machine has not yet."""
    include = sysconfig.get_paths()["include"]
    if not (Path(include) / "Python.h").exists():
        raise NativeUnavailable(f"no Python headers in {include} (install python3-dev)")
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    flags = (*FLAGS, f"-I{include}")
    missing = "no C compiler found (install gcc or set CC)"
    try:
        return compile_cached(
            SOURCE, flags, cache_dir(), "_relay", suffix, missing, suffix, parts()
        )
    except BuildError as exc:
        raise NativeUnavailable(str(exc)) from None


@functools.cache
def module() -> Relay:
    """The loaded extension, built on the first call in this process."""
    path = build()
    loader = importlib.machinery.ExtensionFileLoader("gateway.relay.native._relay", str(path))
    spec = importlib.util.spec_from_file_location(
        "gateway.relay.native._relay", path, loader=loader
    )
    assert spec is not None
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return cast(Relay, mod)


def choice(configured: str) -> str:
    """The relay asked for: $UNITGATE_RELAY when set, else `configured`."""
    return env_choice(ENV, configured, "[upstream] relay", RELAYS)


def resolve(configured: str) -> tuple[Relay | None, str | None]:
    """The native module to use (None: the Python relay) and, for "auto" without it, why.

    Raises NativeUnavailable when "native" was asked for and cannot be had."""
    chosen = choice(configured)
    if chosen == "python":
        return None, None
    try:
        return module(), None
    except (NativeUnavailable, OSError, ImportError, subprocess.TimeoutExpired) as exc:
        if chosen == "native":
            raise NativeUnavailable(f"the native relay is unavailable: {exc}") from exc
        return None, f"the native relay is unavailable, relaying in Python: {exc}"
