"""The two tokenizers grammars are tested with, and a random walk through a grammar.

A walk stands in for a model that only ever samples allowed tokens: at each step it picks
one of the mask's tokens uniformly (seeded), takes a stop token with probability 1/2 once one
is allowed, and returns the decoded text, or None past `limit` tokens.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Collection

import numpy as np
import torch

from engine.grammar import GrammarBackend, unpack_bits
from engine.model.gguf import GGUFFile, gguf_tokenizer, packaged_file
from engine.model.tokenizer import ByteTokenizer, Tokenizer

# The tiny test models' vocabulary (engine/model/config.py) is wider than ByteTokenizer's.
BYTE_MODEL_VOCAB = 512
TOKENIZERS = ("byte", "smollm2")


@functools.cache
def tokenizer_and_backend(name: str) -> tuple[Tokenizer, GrammarBackend]:
    """SmolLM2's tokenizer comes from its GGUF metadata alone (about 0.15 s, no weights)."""
    if name == "byte":
        byte = ByteTokenizer()
        return byte, GrammarBackend(byte, BYTE_MODEL_VOCAB)
    tok = gguf_tokenizer(GGUFFile(packaged_file("smollm2")))
    return tok, GrammarBackend(tok, tok.vocab_size)


def allowed(backend: GrammarBackend, mask: torch.Tensor) -> list[int]:
    return unpack_bits(mask, backend.vocab_size)[0].nonzero().flatten().tolist()


def walk(
    name: str,
    grammar: str,
    rng: random.Random,
    limit: int = 400,
    prefer: Collection[int] = (),
) -> str | None:
    """The text of one walk; `prefer`red tokens (closing quotes, brackets) are picked half
    the time they are allowed, to end walks through unbounded grammars."""
    tokenizer, backend = tokenizer_and_backend(name)
    matcher, mask, ids = backend.matcher(grammar), backend.allocate(1), list[int]()
    for _ in range(limit):
        backend.fill([matcher], mask)
        bits = unpack_bits(mask, backend.vocab_size)[0].numpy()
        options = np.flatnonzero(bits)  # inside a string: most of the 49152 ids
        assert len(options), "a constrained row must never be empty"
        assert int(options[-1]) < tokenizer.vocab_size, "an id past the tokenizer's was allowed"
        stops = [t for t in tokenizer.stop_ids if bits[t]]
        favoured = [t for t in prefer if bits[t]]
        if stops and rng.random() < 0.5:
            token = rng.choice(stops)
        elif favoured and rng.random() < 0.5:
            token = rng.choice(favoured)
        else:
            token = int(options[rng.randrange(len(options))])
        matcher.accept(token)
        if token in tokenizer.stop_ids:
            assert matcher.is_finished
            return tokenizer.decode(ids)
        ids.append(token)
    return None


def token_ids(name: str, pieces: Collection[str]) -> set[int]:
    """Ids of tokens that are exactly one of `pieces`."""
    tokenizer, _ = tokenizer_and_backend(name)
    found = set()
    for piece in pieces:
        ids = tokenizer.encode(piece)
        if len(ids) == 1:
            found.add(ids[0])
    return found
