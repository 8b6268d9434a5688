"""The leader's structured output: llguidance over the model's tokenizer, and the thread that
fills next-token masks while the forward runs.

The backend indexes the whole vocabulary (0.35 s for SmolLM2's), so it is built at start on a
thread of its own: the first constrained request would otherwise wait for it on the HTTP
server's event loop. The masks of a step are filled on the mask thread between the step
message and the end of the forward (llguidance works without the GIL; vLLM overlaps them the
same way); the matchers are not touched again until the result is read.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from engine.grammar import GrammarBackend, GrammarError, Matcher
from engine.model import Tokenizer

log = logging.getLogger(__name__)


class Constraints:
    def __init__(self, tokenizer: Tokenizer, vocab_size: int) -> None:
        self._tokenizer, self._vocab_size = tokenizer, vocab_size
        self._backend: GrammarBackend | None = None
        self._lock = threading.Lock()
        self._masks = ThreadPoolExecutor(1, thread_name_prefix="grammar-masks")

    def warm(self) -> None:
        """Build the backend now, off the caller's thread."""
        threading.Thread(target=self._warm, name="grammar-warmup", daemon=True).start()

    def _warm(self) -> None:
        try:
            _ = self.backend
        except (TypeError, ValueError) as exc:  # reported when a request asks for a grammar
            log.info("leader: structured output unavailable for this tokenizer (%s)", exc)

    @property
    def backend(self) -> GrammarBackend:
        with self._lock:
            if self._backend is None:
                self._backend = GrammarBackend(self._tokenizer, self._vocab_size)
            return self._backend

    def check(self, grammar: str) -> None:
        """GrammarError when `grammar` cannot constrain this model's tokens."""
        try:
            backend = self.backend
        except (TypeError, ValueError) as exc:  # a tokenizer llguidance cannot serve
            raise GrammarError(f"this model's tokenizer cannot be constrained: {exc}") from None
        backend.check(grammar)

    def matcher(self, grammar: str | None) -> Matcher | None:
        return None if grammar is None else self.backend.matcher(grammar)

    def start_masks(self, matchers: Sequence[Matcher | None]) -> Future[torch.Tensor] | None:
        """The rows' next-token bitmask, filled on the mask thread; None when no row has a
        grammar."""
        if all(matcher is None for matcher in matchers):
            return None
        backend = self.backend
        bitmask = backend.allocate(len(matchers))

        def fill() -> torch.Tensor:
            backend.fill(matchers, bitmask)
            return bitmask

        return self._masks.submit(fill)

    def shutdown(self) -> None:
        self._masks.shutdown(wait=False, cancel_futures=True)
