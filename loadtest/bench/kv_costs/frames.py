"""KV event frames as vLLM 0.32's ZMQ publisher sends them, built here without vLLM.

vLLM 0.32 encodes its events as tagged msgspec structs with `omit_defaults`: maps whose first
key is `"type"`, then the fields in their declared order, a field at its default (None) left
out except those declared without one (`lora_id`, `medium`, `lora_name`), which are always
sent. A plain prompt's `extra_keys` is one None per block. Block hashes are 64-bit ints
(`VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`, on by default). Each engine step publishes one batch
`[ts, events]` (the data-parallel rank, None, left out) as `[topic, seq, payload]`. Eviction
is one `BlockRemoved` of one hash per block (vLLM's block pool emits them so).

The chains are random but seeded: the same seed gives the same token ids and hashes, which is
what two units caching the same prompt publish (vLLM's hash seed is fixed for sha256).
"""

from __future__ import annotations

import random
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

MEDIUM = "GPU"
_ENCODER = msgspec.msgpack.Encoder()


@dataclass(frozen=True, slots=True)
class Chain:
    """One prompt's full blocks: `hashes[i]` holds `tokens[i*size:][:size]`."""

    hashes: list[int]
    tokens: list[int]
    size: int


def stored(
    hashes: Sequence[int], parent: int | None, tokens: Sequence[int], size: int
) -> dict[str, Any]:
    return {
        "type": "BlockStored",
        "block_hashes": list(hashes),
        "parent_block_hash": parent,
        "token_ids": list(tokens),
        "block_size": size,
        "lora_id": None,
        "medium": MEDIUM,
        "lora_name": None,
        "extra_keys": [None] * len(hashes),
        "group_idx": 0,
    }


def removed(engine_hash: int) -> dict[str, Any]:
    return {"type": "BlockRemoved", "block_hashes": [engine_hash], "medium": MEDIUM, "group_idx": 0}


def frame(seq: int, events: list[dict[str, Any]], ts: float = 1.0e9) -> list[bytes]:
    """One published message: topic (vLLM's default, empty), sequence number, batch."""
    return [b"", seq.to_bytes(8, "big", signed=True), _ENCODER.encode([ts, events])]


class Chains:
    """Seeded random chains: token ids below 65,536, 64-bit engine hashes."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)

    def chain(self, blocks: int, size: int) -> Chain:
        rng = self._rng
        tokens = array("H", rng.randbytes(2 * blocks * size)).tolist()
        return Chain([rng.getrandbits(64) for _ in range(blocks)], tokens, size)

    def chains(
        self, total: int, size: int, shortest: int = 8, longest: int = 64
    ) -> Iterator[Chain]:
        """Chains of `shortest` to `longest` blocks, `total` blocks in all."""
        left = total
        while left > 0:
            blocks = min(left, self._rng.randint(shortest, longest))
            left -= blocks
            yield self.chain(blocks, size)

    def holders(self, most: int) -> int:
        """How many units hold the next chain: 1 to `most`, each as likely."""
        return self._rng.randint(1, most)
