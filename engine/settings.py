"""One node's settings, built once from `unitgate node`'s flags and checked once.

Below the command line nothing reads argparse's Namespace: backends get this frozen value, so
what they run with is exactly what the checks passed. The checks run before any weight is
loaded or any peer waited for (minutes, on a big model), and each error names the flag and
the bad value, as the gateway's config errors name the key.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class NodeSettings:
    """Defaults here are the flags' defaults (`engine.flags` reads them from this class)."""

    role: str  # "leader" (rank 0, serves the API) or "follower"
    unit: str = "unit-0"
    rank: int = 0
    world_size: int = 1
    # builtin: pipeline stages; the nodes form tp x pp with tp = world_size / pp
    pp: int = 1
    master: str = "127.0.0.1:29500"  # the leader's rendezvous HOST:PORT
    backend: str = "builtin"
    # the leader's OpenAI API
    host: str = "127.0.0.1"
    port: int = 8000
    served_model_name: str | None = None
    # /health from a thread of its own; None (a leader only): on the API port alone
    health_host: str = "127.0.0.1"
    health_port: int | None = None
    # the model and the engine
    model: str = "tiny"
    seed: int = 0
    num_slots: int = 8
    max_seq_len: int | None = None
    threads: int = 0
    device: str = "cpu"
    dtype: str | None = None
    # builtin: how the matrices are stored (see engine.model.narrow); None: as --dtype
    weight_dtype: str | None = None
    # builtin: prompt tokens one step feeds at most (chunked prefill); None: the engine's
    # default, engine.scheduler.DEFAULT_PREFILL_CHUNK
    prefill_chunk: int | None = None
    # builtin: reuse cached prompt prefixes (the KV cache is paged either way)
    prefix_caching: bool = True
    # builtin leader: publish the prefix cache's events as vLLM's ZMQ publisher does, on this
    # endpoint (tcp://HOST:PORT, ipc://PATH), with a replay socket on the other if given
    kv_events: str | None = None
    kv_events_replay: str | None = None
    collective_timeout: float = 10.0
    connect_timeout: float = 300.0
    # the vllm backend (checked by it, once it knows vLLM is installed)
    vllm_args: str = "{}"
    leader_lost_after: float = 5.0

    def __post_init__(self) -> None:
        _check_shape(self)
        _check_ports(self)
        _check_engine(self)

    @classmethod
    def from_flags(cls, flags: argparse.Namespace) -> NodeSettings:
        """A follower always serves /health (on a free port unless told); a leader's health
        listener shares the API's host, as the config's `nodes[0]` shares `leader`'s."""
        values: dict[str, Any] = {f.name: getattr(flags, f.name) for f in dataclasses.fields(cls)}
        leader = values["role"] == "leader"
        if values["health_host"] is None:
            values["health_host"] = values["host"] if leader else "127.0.0.1"
        if values["health_port"] is None and not leader:
            values["health_port"] = 0
        return cls(**values)

    @property
    def is_leader(self) -> bool:
        return self.role == "leader"

    @property
    def listener_port(self) -> int:
        """The port a /health thread listener binds (a follower's always runs): unset is 0,
        a free one."""
        return 0 if self.health_port is None else self.health_port

    @property
    def master_addr(self) -> tuple[str, int]:
        host, _, port = self.master.rpartition(":")
        return host, int(port)


def _check_shape(s: NodeSettings) -> None:
    if s.role not in ("leader", "follower"):
        raise ValueError(f"--role: expected leader or follower, got {s.role!r}")
    if s.world_size < 1:
        raise ValueError(f"--world-size: must be >= 1, got {s.world_size}")
    if not 0 <= s.rank < s.world_size:
        raise ValueError(f"--rank: must be in 0..{s.world_size - 1}, got {s.rank}")
    if s.is_leader != (s.rank == 0):
        want = "0" if s.is_leader else f"1..{s.world_size - 1}"
        raise ValueError(f"--rank: a {s.role} has rank {want}, got {s.rank}")
    host, _, port = s.master.rpartition(":")
    if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"--master: expected HOST:PORT, got {s.master!r}")
    _check_pp(s)


# Why pipeline stages across nodes are refused for vLLM units (here, and in engine_args by
# engine.backends.vllm.args): tried with vLLM 0.32's CPU build (2026-12-07: 2 nodes,
# pipeline_parallel_size 2, tensor_parallel_size 1, the mp executor), the second stage's worker
# failed the first step (an AssertionError in sync_and_gather_intermediate_tensors) and the
# unit never served.
NO_PIPELINE_HERE = "vLLM's CPU build fails its first step with pipeline stages across nodes"


def _check_pp(s: NodeSettings) -> None:
    if s.pp < 1:
        raise ValueError(f"--pp: must be >= 1, got {s.pp}")
    if s.world_size % s.pp:
        raise ValueError(
            f"--pp: {s.pp} pipeline stages do not divide --world-size {s.world_size} "
            f"(the nodes form tp x pp)"
        )
    if s.pp > 1 and s.backend != "builtin":
        raise ValueError(
            f"--pp: only applies to --backend builtin ({NO_PIPELINE_HERE}), got {s.pp} with "
            f"--backend {s.backend}"
        )


def _check_ports(s: NodeSettings) -> None:
    for flag, value in (("--port", s.port), ("--health-port", s.health_port)):
        if value is not None and not 0 <= value <= 65535:
            raise ValueError(f"{flag}: must be 0..65535, got {value}")


# The names of the arithmetic's dtypes (engine.device maps them to torch's), and of how the
# builtin engine may store its matrices: any of those, or "gguf", a GGUF file's own quantized
# blocks (engine.model.blocks). The gateway's config checks a unit's against a copy of this.
DTYPES = ("float32", "float16", "bfloat16")
WEIGHT_DTYPES = (*DTYPES, "gguf")


def _check_engine(s: NodeSettings) -> None:
    for flag, dtype, names in (
        ("--dtype", s.dtype, DTYPES),
        ("--weight-dtype", s.weight_dtype, WEIGHT_DTYPES),
    ):
        if dtype is not None and dtype not in names:
            raise ValueError(f"{flag}: expected one of {', '.join(names)}, got {dtype!r}")
    if s.weight_dtype is not None and s.backend != "builtin":
        raise ValueError(
            f"--weight-dtype: only applies to --backend builtin (vLLM: --vllm-args dtype), "
            f"got {s.weight_dtype!r} with --backend {s.backend}"
        )
    if s.weight_dtype == "gguf":
        _check_blocks(s)
    _check_prefill_chunk(s)
    _check_prefix_cache(s)
    if s.num_slots < 1:
        raise ValueError(f"--num-slots: must be >= 1, got {s.num_slots}")
    for flag, seconds in (
        ("--collective-timeout", s.collective_timeout),
        ("--connect-timeout", s.connect_timeout),
    ):
        if not seconds > 0:
            raise ValueError(f"{flag}: must be > 0 seconds, got {seconds}")


def _check_prefill_chunk(s: NodeSettings) -> None:
    if s.prefill_chunk is None:
        return
    if s.prefill_chunk < 1:
        raise ValueError(f"--prefill-chunk: must be >= 1 token, got {s.prefill_chunk}")
    if s.backend != "builtin":
        raise ValueError(
            f"--prefill-chunk: only applies to --backend builtin (vLLM: --vllm-args "
            f"max_num_batched_tokens), got {s.prefill_chunk} with --backend {s.backend}"
        )


def _check_prefix_cache(s: NodeSettings) -> None:
    vllm = "vLLM: --vllm-args enable_prefix_caching and kv_events_config"
    if not s.prefix_caching and s.backend != "builtin":
        raise ValueError(f"--no-prefix-caching: only applies to --backend builtin ({vllm})")
    for flag, endpoint in (
        ("--kv-events", s.kv_events),
        ("--kv-events-replay", s.kv_events_replay),
    ):
        if endpoint is None:
            continue
        if s.backend != "builtin":
            raise ValueError(f"{flag}: only applies to --backend builtin ({vllm})")
        if not s.is_leader:
            raise ValueError(f"{flag}: only the leader publishes KV events, got --role {s.role}")
        if not endpoint.startswith(("tcp://", "ipc://")):
            raise ValueError(f"{flag}: expected tcp://HOST:PORT or ipc://PATH, got {endpoint!r}")
    if s.kv_events_replay is not None and s.kv_events is None:
        raise ValueError("--kv-events-replay: needs --kv-events (the stream it replays)")
    if s.kv_events is not None and not s.prefix_caching:
        raise ValueError("--kv-events: with --no-prefix-caching the cache stores no blocks")


def _check_blocks(s: NodeSettings) -> None:
    """The file's blocks exist only in a GGUF file, and the kernel multiplies float32."""
    from engine.model.gguf.packaged import PACKAGED, is_gguf

    if not is_gguf(s.model):
        raise ValueError(
            f"--weight-dtype: 'gguf' keeps a GGUF file's quantized blocks, so it needs a "
            f"GGUF model ({', '.join(PACKAGED)} or a .gguf path), got --model {s.model!r}"
        )
    if s.dtype not in (None, "float32"):
        raise ValueError(
            f"--weight-dtype: 'gguf' multiplies float32 activations, got --dtype {s.dtype!r}"
        )
