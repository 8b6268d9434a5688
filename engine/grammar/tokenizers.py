"""The engine's tokenizers as llguidance sees them: every token's bytes, and which ids stop.

An `LLTokenizer` indexes the whole vocabulary (a token trie; about 0.35 s for SmolLM2's 49152
tokens), so it is built once per tokenizer and cached. Its end of sequence is the engine's
`stop_ids`, the only tokens a finished grammar allows, so generation ends with finish_reason
"stop" right after the last byte the grammar needs. Ids the model has past the tokenizer's
are not llguidance's business: `GrammarBackend.fill` disallows them.
"""

from __future__ import annotations

import json
import threading
import weakref
from typing import Any

import llguidance

from engine.model.tokenizer import ByteTokenizer, TemplatedTokenizer, Tokenizer

_CACHE: weakref.WeakKeyDictionary[Any, llguidance.LLTokenizer] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def ll_tokenizer(tokenizer: Tokenizer) -> llguidance.LLTokenizer:
    """llguidance's view of `tokenizer` (cached while the tokenizer lives)."""
    with _LOCK:
        if tokenizer not in _CACHE:
            _CACHE[tokenizer] = _build(tokenizer)
        return _CACHE[tokenizer]


def _build(tokenizer: Tokenizer) -> llguidance.LLTokenizer:
    stops = sorted(tokenizer.stop_ids)
    if not stops:
        raise ValueError("tokenizer: a grammar needs a stop token, and this tokenizer has none")
    if isinstance(tokenizer, ByteTokenizer):
        wrapper = llguidance.TokenizerWrapper(_ByteVocab(tokenizer))
        return llguidance.LLTokenizer(wrapper, eos_token=stops)
    if isinstance(tokenizer, TemplatedTokenizer):
        text = _tokenizer_json(tokenizer.tok)
        return llguidance.LLTokenizer(text, eos_token=stops)
    raise TypeError(f"tokenizer: no llguidance adapter for {type(tokenizer).__name__}")


def _tokenizer_json(tok: Any) -> str:
    """tokenizer.json text, without padding or truncation (they would change what llguidance
    gets back when it tokenizes)."""
    text: str = tok.to_str()
    if tok.padding is None and tok.truncation is None:
        return text
    data = json.loads(text)
    data["padding"] = data["truncation"] = None
    return json.dumps(data)


class _ByteVocab:
    """ByteTokenizer in the shape `llguidance.TokenizerWrapper` reads: byte ids are their byte,
    specials are marked with a leading 0xff (llguidance's convention)."""

    def __init__(self, tokenizer: ByteTokenizer) -> None:
        self.eos_token_id = tokenizer.eos_id
        self.bos_token_id = tokenizer.bos_id
        specials = [b"\xff" + name.encode() for name in tokenizer.SPECIALS]
        self.tokens = [bytes([i]) for i in range(256)] + specials
        self.special_token_ids = list(range(256, 256 + len(specials)))

    def __call__(self, text: bytes) -> list[int]:
        return list(text)
