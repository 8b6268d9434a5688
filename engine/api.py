"""The seam between the leader's HTTP server and its engine loop.

The server speaks HTTP and OpenAI JSON; the engine speaks token ids. The server hands the
engine a GenerationRequest and consumes TokenEvents; aborting is a call, not a cancellation
the engine has to notice. Keeping this seam small lets another backend (vLLM) sit behind the
same server.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

from engine.model.tokenizer import Tokenizer
from engine.scheduler import SamplingParams


class TokenOutOfVocab(ValueError):
    """A prompt id the model has no embedding for. Engines check ids against the model's own
    vocabulary, which may be larger than the tokenizer's (padded embeddings): a resumed
    stream sends back every id the model generated, including those."""

    def __init__(self, token: int, vocab_size: int) -> None:
        super().__init__(f"token id {token} is outside [0, {vocab_size})")
        self.token, self.vocab_size = token, vocab_size


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """`n` choices of one prompt (one prefill, shared); `grammar`, when set, constrains every
    choice (llguidance grammar text the server has checked against the engine's tokenizer).
    `announce_start`: the engine yields `STARTED` once the request leaves its queue and its
    prompt is first fed to the model (a tied request's signal: the server sends its answer's
    head then); an engine that cannot tell never yields it."""

    request_id: str
    prompt_ids: tuple[int, ...]
    params: SamplingParams
    n: int = 1
    grammar: str | None = None
    announce_start: bool = False


@dataclass(frozen=True, slots=True)
class TokenEvent:
    """One step's news for one choice of a request: a new token (and the text it made
    visible), or that choice's end. A request with n choices ends after n finished events;
    `completion_tokens` counts this choice's tokens.

    `logprob` and `top_logprobs` come with a token when the request asked for logprobs: the
    sampled token's, and the most likely tokens' (sorted, the sampled one included)."""

    request_id: str
    token_id: int | None  # None on a final event that carries no new token
    text: str  # visible text delta (may be "" while a stop string could still be forming)
    finished: bool
    finish_reason: str | None  # "stop" | "length" | "abort" | "error" when finished
    prompt_tokens: int
    completion_tokens: int
    error: str | None = None
    index: int = 0
    logprob: float | None = None
    top_logprobs: tuple[tuple[int, float], ...] = ()
    # Leading prompt tokens the engine's prefix cache held (usage's
    # prompt_tokens_details.cached_tokens); 0 where the engine keeps no prefix cache.
    cached_tokens: int = 0


# Yielded once by `Engine.generate` for a request with `announce_start`, before its first
# token: the request left the queue and its prompt is being fed. Compared by identity.
STARTED = TokenEvent("", None, "", False, None, 0, 0)


class Engine(Protocol):
    """What the leader server needs from an engine backend (builtin or vLLM)."""

    @property
    def model_name(self) -> str: ...

    @property
    def tokenizer(self) -> Tokenizer: ...

    @property
    def max_seq_len(self) -> int: ...

    def check_grammar(self, grammar: str) -> None:
        """Raise engine.grammar.GrammarError when `grammar` cannot constrain this model's
        tokens (the server turns it into a 400 before anything is queued)."""

    def generate(self, request: GenerationRequest) -> AsyncIterator[TokenEvent]:
        """Events until every choice's finished=True (and `STARTED` first, if the request
        asked and the engine can tell); raises ValueError for a request it refuses."""
        ...

    def abort(self, request_id: str) -> None:
        """The client went away: free the sequence at the next step. Idempotent."""

    def health(self) -> dict[str, Any]:
        """Node health fields: status, role, unit, rank, pid, step, pending (+ extras)."""
        ...
