"""The builtin engine under the model id the gateway routes by."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from engine.api import Engine, GenerationRequest, TokenEvent
from engine.model.tokenizer import Tokenizer


class ServedAs:
    """The same engine under another model id: the gateway forwards request bodies unchanged,
    so the leader must accept the id the gateway routes by (like vLLM's --served-model-name)."""

    def __init__(self, engine: Engine, name: str) -> None:
        self._engine, self._name = engine, name

    @property
    def model_name(self) -> str:
        return self._name

    @property
    def tokenizer(self) -> Tokenizer:
        return self._engine.tokenizer

    @property
    def max_seq_len(self) -> int:
        return self._engine.max_seq_len

    def check_grammar(self, grammar: str) -> None:
        self._engine.check_grammar(grammar)

    def generate(self, request: GenerationRequest) -> AsyncIterator[TokenEvent]:
        return self._engine.generate(request)

    def abort(self, request_id: str) -> None:
        self._engine.abort(request_id)

    def health(self) -> dict[str, Any]:
        return self._engine.health()
