"""The vLLM backend: a unit whose nodes run vLLM, the leader behind vLLM's own OpenAI server.

Nothing here imports vLLM at module level: `unitgate node --backend builtin` and the gateway
must work where vLLM is not installed. `require_vllm` is the one place that says what to
install when it is missing.
"""

from __future__ import annotations

import importlib.util

from engine.backends.registry import BackendUnavailable

INSTALL_HINT = "pip install 'unitgate[vllm]'"


class VllmMissing(BackendUnavailable):
    """`--backend vllm` on an interpreter without vLLM."""


def require_vllm() -> None:
    """Fail with one actionable line before any slow start-up work."""
    if importlib.util.find_spec("vllm") is None:
        raise VllmMissing(f"--backend vllm: vLLM is not installed; install it with {INSTALL_HINT}")
