"""How much of the fleet's KV cache the workload's shared prefixes fill: the arithmetic.

A server's cache holds `kv_bytes // (block_size * bytes per token)` blocks, one of which vLLM
keeps as its null block. The working set is every group's shared prefix in whole blocks (an
engine caches only full blocks). Routing that sends each group to one unit needs the working
set to fit the fleet; routing by load alone caches every group on every unit, so it needs the
working set to fit each unit. A pressure is the working set's share of the fleet's blocks:
under 1 / units both kinds of routing fit, between that and 1 only the first does.

Pure: the benchmark reads the model's config.json and the prompts' token ids, and checks the
block count against what each server reports (`vllm:cache_config_info`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

BLOCK_SIZE = 128  # vLLM's CPU build's default block size (16 on GPUs)
NULL_BLOCKS = 1  # per server: vLLM's block pool keeps one block aside, always "in use"
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
MIB = 1 << 20


def kv_bytes_per_token(config: Mapping[str, Any], dtype: str = "float32") -> int:
    """A token's K and V in every layer: 2 x layers x KV heads x head size x dtype's bytes
    (vLLM's KV cache takes the model's dtype: the servers run float32)."""
    heads = int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // heads)
    return 2 * int(config["num_hidden_layers"]) * kv_heads * head_dim * DTYPE_BYTES[dtype]


def blocks_in(kv_bytes: int, per_token: int, block_size: int = BLOCK_SIZE) -> int:
    """The blocks a server's KV cache of `kv_bytes` holds, its null block included."""
    return kv_bytes // (block_size * per_token)


@dataclass(frozen=True, slots=True)
class Kv:
    """A server's KV cache: its size, the model's bytes a token, the blocks that makes."""

    mib: int
    per_token: int
    block_size: int = BLOCK_SIZE

    @classmethod
    def of(cls, config: Mapping[str, Any], mib: int) -> Kv:
        return cls(mib, kv_bytes_per_token(config))

    @property
    def bytes(self) -> int:
        return self.mib * MIB

    @property
    def blocks(self) -> int:
        return blocks_in(self.bytes, self.per_token, self.block_size)

    def describe(self) -> str:
        return (
            f"KV cache per server: {self.mib} MiB / ({self.per_token:,} B a token x"
            f" {self.block_size} tokens a block) = {self.blocks} blocks, one of them vLLM's"
            " null block"
        )


def shared_tokens(prompts: Sequence[Sequence[int]]) -> int:
    """How many leading token ids all of `prompts` have in common."""
    if not prompts:
        return 0
    first, n = prompts[0], min(len(p) for p in prompts)
    for i in range(n):
        if any(p[i] != first[i] for p in prompts[1:]):
            return i
    return n


def groups_for(target: float, fleet_blocks: int, blocks_per_group: int) -> int:
    """How many groups make a working set of about `target` of the fleet's blocks (at least 2,
    so that there is something to route)."""
    if blocks_per_group < 1:
        raise ValueError("a group's prefix must fill at least one block")
    return max(2, round(target * fleet_blocks / blocks_per_group))


def hit_ceiling(
    prompt_tokens: Sequence[int], groups: Sequence[int], shared: Sequence[int]
) -> float:
    """The best fleet hit rate the requests allow: every request but each group's first can
    find its group's shared blocks (`shared[g]` tokens) cached, and nothing more."""
    seen: set[int] = set()
    hits = 0
    for group in groups:
        if group in seen:
            hits += shared[group]
        seen.add(group)
    total = sum(prompt_tokens)
    return hits / total if total else 0.0


@dataclass(frozen=True, slots=True)
class Pressure:
    """One workload's size against the fleet's cache."""

    target: float  # the working set's share of the fleet's blocks asked for
    groups: int
    working_set_blocks: int  # the full blocks each group's requests share, over all groups
    server_blocks: int  # usable: without the null block
    servers: int

    @property
    def fleet_blocks(self) -> int:
        return self.server_blocks * self.servers

    @property
    def share_of_fleet(self) -> float:
        return self.working_set_blocks / self.fleet_blocks

    @property
    def share_of_server(self) -> float:
        """What each unit must hold when every unit caches every group (load alone)."""
        return self.working_set_blocks / self.server_blocks

    def describe(self) -> str:
        return (
            f"working set {self.groups} groups, {self.working_set_blocks} blocks:"
            f" {self.share_of_fleet:.0%} of the fleet's {self.fleet_blocks},"
            f" {self.share_of_server:.0%} of one server's {self.server_blocks}"
        )
