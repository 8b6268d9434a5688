"""The gateway's own keys for blocks of tokens, chained as vLLM chains its block hashes.

A block's key is a hash of its parent's key and its token ids: equal keys mean equal token
prefixes up to the end of the block. The gateway computes these keys itself, from the token
ids the engine reports with each stored block and from a request's prompt, so that the
engine's hash algorithm, seed and `PYTHONHASHSEED` never matter: an engine's own hashes are
only mapped to these keys (index.py), never recomputed.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from hashlib import blake2b

ROOT = 0  # the parent key of a prompt's first block
# Mixed into the key of each block whose engine hash carries more than tokens (a LoRA adapter,
# multimodal inputs, a cache salt): such chains never equal a plain prompt's.
_EXTRA = b"extra"


def chain(parent: int, tokens: Sequence[int], extra: bool = False) -> int:
    """The key of the block holding `tokens` after the block keyed `parent`."""
    h = blake2b(parent.to_bytes(8, "little"), digest_size=8)
    if extra:
        h.update(_EXTRA)
    h.update(array("q", tokens).tobytes())
    return int.from_bytes(h.digest(), "little")


def block_keys(tokens: Sequence[int], block_size: int, parent: int = ROOT) -> list[int]:
    """The keys of `tokens`' full blocks of `block_size` (a partial last block has none: an
    engine caches only full blocks)."""
    keys = []
    for start in range(0, len(tokens) - block_size + 1, block_size):
        parent = chain(parent, tokens[start : start + block_size])
        keys.append(parent)
    return keys
