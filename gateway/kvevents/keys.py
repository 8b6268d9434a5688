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


def packed(tokens: Sequence[int]) -> memoryview:
    """Token ids as the keys hash them: 32-bit integers (every vocabulary fits), viewed
    without a copy where they already are (a prompt's ids: prompts.py, the tracker)."""
    if isinstance(tokens, array) and tokens.typecode == "i":
        return memoryview(tokens)
    return memoryview(array("i", tokens))


def chain_packed(parent: int, tokens: memoryview, extra: bool = False) -> int:
    """`chain` of a block's ids as `packed` gives them (a slice of them)."""
    h = blake2b(parent.to_bytes(8, "little"), digest_size=8)
    if extra:
        h.update(_EXTRA)
    h.update(tokens)
    return int.from_bytes(h.digest(), "little")


def chain(parent: int, tokens: Sequence[int], extra: bool = False) -> int:
    """The key of the block holding `tokens` after the block keyed `parent`."""
    return chain_packed(parent, packed(tokens), extra)


def block_keys(tokens: Sequence[int], block_size: int, parent: int = ROOT) -> list[int]:
    """The keys of `tokens`' full blocks of `block_size` (a partial last block has none: an
    engine caches only full blocks). The ids are packed once and hashed slice by slice."""
    view = packed(tokens)
    keys = []
    for start in range(0, len(view) - block_size + 1, block_size):
        parent = chain_packed(parent, view[start : start + block_size])
        keys.append(parent)
    return keys
