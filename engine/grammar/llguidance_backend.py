"""Grammars against one engine's tokenizer: checks for the HTTP handler, and per-sequence
matchers whose next-token masks the leader fills each step.

A mask row is `ceil(vocab_size / 32)` int32 words, bit `i % 32` of word `i // 32` set when
token `i` is allowed (llguidance's layout; `engine.sampling` applies it to logits). Unconstrained
rows allow everything. llguidance knows only the tokenizer's ids and fills the leading words
of a constrained row; the rest, ids only the model has, stay zero. Once the grammar is
complete (or a token was refused) a constrained row allows exactly the tokenizer's stop ids,
so it is never empty.
"""

from __future__ import annotations

from collections.abc import Sequence

import llguidance
import torch

from engine.grammar.errors import GrammarError
from engine.grammar.tokenizers import ll_tokenizer
from engine.grammar.validate import LIMITS, validate
from engine.model.tokenizer import Tokenizer


class Matcher:
    """One sequence's position in its grammar."""

    __slots__ = ("_llm",)

    def __init__(self, llm: llguidance.LLMatcher) -> None:
        self._llm = llm

    def accept(self, token: int) -> None:
        """Advance by `token`; GrammarError when the grammar does not allow it here (then the
        matcher is spent: every later mask allows only the stop tokens)."""
        if not self._llm.consume_token(token):
            raise GrammarError(f"token {token} is not allowed here: {_error(self._llm)}")

    @property
    def error(self) -> str | None:
        """Why the matcher failed (a refused token, or a grammar it found empty), or None."""
        return _error(self._llm) if self._llm.is_error() else None

    @property
    def is_finished(self) -> bool:
        """The grammar is complete and nothing may follow but a stop token (also true once
        a token was refused)."""
        return self._llm.is_stopped()


class GrammarBackend:
    """llguidance over the engine's tokenizer, for a model with `vocab_size` logits (which
    may exceed the tokenizer's vocabulary)."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int) -> None:
        self._tokenizer = ll_tokenizer(tokenizer)
        if vocab_size < self._tokenizer.vocab_size:
            raise ValueError(
                f"vocab_size: the model's {vocab_size} is below its tokenizer's "
                f"{self._tokenizer.vocab_size}"
            )
        self.vocab_size = vocab_size
        self._words = _words(vocab_size)
        self._known = _words(self._tokenizer.vocab_size)  # the words llguidance writes

    def check(self, grammar: str) -> None:
        """GrammarError when `grammar` cannot constrain this model, or admits no output at
        all (about a millisecond for an ordinary schema, so the HTTP handler calls it).

        llguidance compiles some satisfiable schemas to an empty language (0.25 is the one
        number with `exclusiveMinimum: 0.125, maximum: 0.25, multipleOf: 0.125`, and it
        admits none); its matcher then fails at its first mask, and allowed only the stop
        token, the answer would be empty with finish_reason "stop"."""
        validate(grammar, self._tokenizer)
        matcher = self.matcher(grammar)
        self.fill([matcher], self.allocate(1))
        if matcher.error is not None:
            raise GrammarError(
                "nothing can be generated that the grammar allows (for a JSON Schema: no value"
                " meets all of its constraints as the grammar library compiles them)"
            )

    def matcher(self, grammar: str) -> Matcher:
        """A matcher at the start of `grammar` (about 1 ms for an ordinary schema)."""
        llm = llguidance.LLMatcher(self._tokenizer, grammar, log_level=0, limits=LIMITS)
        if llm.is_error():
            raise GrammarError(_error(llm))
        return Matcher(llm)

    def allocate(self, batch: int) -> torch.Tensor:
        """A (batch, ceil(vocab_size / 32)) int32 bitmask, every token allowed."""
        return torch.full((batch, self._words), -1, dtype=torch.int32)

    def fill(self, matchers: Sequence[Matcher | None], bitmask: torch.Tensor) -> None:
        """Row i <- the tokens matchers[i] allows next; every token where it is None.

        Row after row: llguidance's thread pool (`fill_next_token_bitmask_par`) was no
        faster at batch 8 or 16 on 2 CPUs (0.3 ms median, 1-2 ms p90 either way)."""
        self._check_shape(bitmask, len(matchers))
        for i, matcher in enumerate(matchers):
            row = bitmask[i]
            if matcher is None:
                row.fill_(-1)
                continue
            matcher._llm.unsafe_compute_mask_ptr(row.data_ptr(), self._known * 4)
            if matcher._llm.is_error():  # it allows the stop token only: an empty or cut
                row.fill_(0)  # answer would pass for a whole one, so it gets no token
                continue
            row[self._known :] = 0

    def _check_shape(self, bitmask: torch.Tensor, batch: int) -> None:
        """The mask is written through a raw pointer: a wrong buffer must not get that far."""
        ok = (
            bitmask.dim() == 2
            and bitmask.shape[0] >= batch
            and bitmask.shape[1] == self._words
            and bitmask.dtype == torch.int32
            and bitmask.device.type == "cpu"
            and bitmask.is_contiguous()
        )
        if not ok:
            raise ValueError(
                f"bitmask: expected a contiguous CPU int32 tensor ({batch}+, {self._words}), "
                f"got {bitmask.dtype} {tuple(bitmask.shape)} on {bitmask.device}"
            )


def _error(llm: llguidance.LLMatcher) -> str:
    """llguidance's message, without the marker it leaves where verbose errors would go."""
    return llm.get_error().replace("<non-verbose/>", "").strip() or "the grammar has ended"


def _words(vocab: int) -> int:
    return (vocab + 31) // 32
