"""Node backends by name, each imported only when chosen.

A backend is a module with `run_node(settings) -> exit code`. Naming it here as a string,
not importing it, keeps optional backends optional: `unitgate node --backend builtin` (and
the gateway) never import vLLM's wiring, let alone vLLM.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.settings import NodeSettings

RunNode = Callable[["NodeSettings"], int]

BACKENDS: dict[str, str] = {
    "builtin": "engine.backends.builtin.node",
    "vllm": "engine.backends.vllm.node",
}


class BackendUnavailable(RuntimeError):
    """The chosen backend's dependencies are not installed; the message says what to install."""


def lookup(name: str) -> RunNode:
    if name not in BACKENDS:
        raise ValueError(f"--backend: expected one of {', '.join(BACKENDS)}, got {name!r}")
    run: RunNode = importlib.import_module(BACKENDS[name]).run_node
    return run
