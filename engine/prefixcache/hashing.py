"""Block hashes for the prefix cache, chained as vLLM chains them (v1/core/kv_cache_utils.py).

A full block of `block_size` token ids is named by a hash of its parent's hash and its ids, so
equal hashes mean equal token prefixes up to the end of the block. The first block's parent is
`NONE_HASH`, a hash of a fixed seed. This is vLLM's default algorithm ("sha256"):

    NONE_HASH = sha256(pickle("vllm-none-hash"))
    hash(block) = sha256(pickle((parent_hash or NONE_HASH, tuple(token_ids), None)))

with pickle protocol 5 (vLLM's HIGHEST_PROTOCOL on Python 3.8 to 3.14), the trailing None being
vLLM's `extra_keys` of a block with no LoRA adapter, multimodal input or cache salt. The
serialized tuple holds only bytes, ints and None, so the bytes and the hash are the same in
every process and on every run: no `hash()`, no dependence on PYTHONHASHSEED (vLLM lets
PYTHONHASHSEED replace the seed; this module never does). The hashes therefore equal a stock
vLLM's for the same tokens and block size, which nothing relies on: the gateway keys blocks
on the token ids the events carry (gateway/kvevents/keys.py).

KV events carry `external(h)`, the low 64 bits of the digest as an unsigned int, as vLLM
does by default (`VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1`, `maybe_convert_block_hash`).
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Sequence
from typing import NewType

BlockHash = NewType("BlockHash", bytes)  # a sha256 digest, 32 bytes

PICKLE_PROTOCOL = 5
NONE_HASH_SEED = "vllm-none-hash"  # vLLM's DEFAULT_NONE_HASH_SEED
NONE_HASH = BlockHash(hashlib.sha256(pickle.dumps(NONE_HASH_SEED, PICKLE_PROTOCOL)).digest())
_LOW64 = (1 << 64) - 1


def hash_block(parent: BlockHash | None, token_ids: Sequence[int]) -> BlockHash:
    """The hash of the full block holding `token_ids` after the block hashed `parent` (None:
    the first block). Ids are made plain ints first: a numpy integer pickles differently."""
    key = (bytes(parent or NONE_HASH), tuple(int(t) for t in token_ids), None)
    return BlockHash(hashlib.sha256(pickle.dumps(key, PICKLE_PROTOCOL)).digest())


def block_hashes(
    token_ids: Sequence[int], block_size: int, parent: BlockHash | None = None
) -> list[BlockHash]:
    """The chained hashes of `token_ids`' full blocks (a partial last block has none)."""
    if block_size < 1:
        raise ValueError(f"block_size: must be a positive integer, got {block_size!r}")
    hashes: list[BlockHash] = []
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash_block(parent, token_ids[start : start + block_size])
        hashes.append(parent)
    return hashes


def external(h: BlockHash) -> int:
    """The hash as KV events carry it: the digest's low 64 bits (big-endian), as vLLM."""
    return int.from_bytes(h, "big") & _LOW64
