"""Each token's bytes, for logprobs: OpenAI's entries carry the token's text and its bytes.

A byte-level token can end mid-character, so its text alone cannot say which bytes it holds;
llguidance's view of the tokenizer (built once per tokenizer, cached with the grammars) knows
every token's bytes, special tokens by their names. It is built at the first logprobs request.
"""

from __future__ import annotations

from functools import lru_cache

from engine.grammar.tokenizers import ll_tokenizer
from engine.model.tokenizer import Tokenizer

CACHED_TOKENS = 65536


class TokenBytes:
    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self.bytes_of = lru_cache(maxsize=CACHED_TOKENS)(self._bytes)

    def __call__(self, token: int) -> bytes:
        return self.bytes_of(token)

    def _bytes(self, token: int) -> bytes:
        if not 0 <= token < self._tokenizer.vocab_size:
            return b""  # padding past the tokenizer's vocabulary: a token without text
        return bytes(ll_tokenizer(self._tokenizer).decode_bytes([token]))
