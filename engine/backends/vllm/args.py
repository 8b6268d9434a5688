"""`unitgate node` flags -> `vllm serve` arguments, for the leader and for headless followers.

One node of a unit is one vLLM node: `--world-size` nodes make vLLM's `nnodes`, `--rank` its
`node_rank`, and `--master` the address of its torch.distributed rendezvous. Tensor parallelism
spans the nodes (one worker per node unless the engine args say otherwise). Everything else is
what `vllm serve` takes, passed through by name from `--vllm-args` (a JSON object, which is
what `unitgate up` builds from a unit's `engine_args` table): vLLM's engine arguments, and the
leader's OpenAI server's own (`tool_call_parser`, `chat_template`, `api_key`, ...), which a
follower ignores as `vllm serve --headless` does. `serve_args` parses them with vLLM's parser.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

from engine.settings import NO_PIPELINE_HERE, NodeSettings

# Keys unitgate sets from its own flags: taking them from --vllm-args as well would let the two
# disagree about the unit's shape, which only shows up as a hang at rendezvous.
RESERVED = {
    "model": "--model",
    "nnodes": "--world-size",
    "node_rank": "--rank",
    "master_addr": "--master",
    "master_port": "--master",
    "headless": "--role",
    "distributed_executor_backend": "--backend",
    "served_model_name": "--served-model-name",
    "host": "--host",
    "port": "--port",
    "uds": "--host and --port",
}
# A vLLM step on a CPU can take seconds, where the builtin engine's --collective-timeout default
# (10 s) assumes milliseconds; below this floor a healthy but busy unit would be declared dead.
# The first step that asks for logprobs (or top-k/top-p) also compiles vLLM's sampling kernels
# with torch's inductor: 13 s on an idle 2-core machine, over 30 s once under load, when a 30 s
# floor declared the engine dead. The gateway's probes eject a unit whose follower died within
# a second whatever this is; only the leader's own exit (and so the unit's restart) waits for it.
MIN_STEP_TIMEOUT_S = 90.0
DEFAULTS: dict[str, Any] = {
    # Eager mode: compiling graphs costs minutes on a CPU and buys little for small models.
    "enforce_eager": True,
    # vLLM's periodic log lines and Prometheus loggers; the node's own step logger still gets
    # stats (a custom logger keeps stats on).
    "disable_log_stats": True,
}


def add_flags(parser: argparse.ArgumentParser) -> None:
    """The vllm backend's own flags; their defaults are NodeSettings' (see engine.flags)."""
    parser.add_argument(
        "--vllm-args",
        metavar="JSON",
        help="what `vllm serve` takes, by name, as a JSON object: engine arguments and the "
        'leader\'s server\'s, e.g. \'{"dtype": "float32", "tool_call_parser": "hermes"}\'',
    )
    parser.add_argument(
        "--leader-lost-after",
        type=float,
        help="vllm follower: exit once the leader's rendezvous port has been gone this long (s)",
    )


def step_timeout(settings: NodeSettings) -> float:
    """How long one engine step may take before the unit counts as failed."""
    return max(settings.collective_timeout, MIN_STEP_TIMEOUT_S)


def parse_vllm_args(text: str) -> dict[str, Any]:
    """The JSON object of --vllm-args, its keys checked against what unitgate sets itself."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--vllm-args: not valid JSON ({exc})") from None
    if not isinstance(value, dict):
        raise ValueError(f"--vllm-args: expected a JSON object, got {text!r}")
    check_keys(value, "--vllm-args")
    return value


NO_PIPELINE = f"{NO_PIPELINE_HERE} (0.32); the builtin backend runs them (a unit's pp)"


def check_keys(engine_args: dict[str, Any], where: str) -> None:
    """Refuse keys unitgate owns, and settings vLLM's CPU build cannot run; callers without
    vLLM installed can still run this."""
    for key, value in engine_args.items():
        if key in RESERVED:
            raise ValueError(f"{where}: {key!r} is set by unitgate (from {RESERVED[key]})")
        if key == "pipeline_parallel_size" and value != 1:
            raise ValueError(f"{where}: {key!r} = {value!r}: {NO_PIPELINE}")


def check_known(engine_args: dict[str, Any], known: set[str], where: str) -> None:
    """A misspelt argument must stop the node, not be silently dropped."""
    for key in engine_args:
        if key not in known:
            raise ValueError(f"{where}: {key!r} is not a vLLM engine or server argument")


def engine_kwargs(settings: NodeSettings) -> dict[str, Any]:
    """`vllm serve`'s arguments by name for this node, leader or follower alike (vLLM needs
    both sides to agree on the whole parallel config; a follower ignores the server's)."""
    kwargs: dict[str, Any] = {
        **DEFAULTS,
        "model": settings.model,
        "tensor_parallel_size": settings.world_size,
        "distributed_executor_backend": "mp",
    }
    if settings.dtype:
        kwargs["dtype"] = settings.dtype
    if settings.max_seq_len is not None:
        kwargs["max_model_len"] = settings.max_seq_len
    kwargs["max_num_seqs"] = settings.num_slots
    kwargs |= parse_vllm_args(settings.vllm_args)
    if settings.world_size > 1:
        host, port = settings.master_addr
        kwargs |= {"nnodes": settings.world_size, "node_rank": settings.rank}
        kwargs |= {"master_addr": host, "master_port": port}
    # The id clients send: the folder's name unless told, not vLLM's default (the full path).
    kwargs["served_model_name"] = settings.served_model_name or Path(settings.model).name
    return kwargs


def known_engine_args() -> set[str]:
    """The names `--vllm-args` takes: vLLM's engine arguments (AsyncEngineArgs) and its
    OpenAI server's (FrontendArgs). Imports vLLM (seconds), so only where it will run."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.cli_args import FrontendArgs

    return {f.name for cls in (AsyncEngineArgs, FrontendArgs) for f in dataclasses.fields(cls)}
