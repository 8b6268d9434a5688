"""The leader's batch sampler: one token per row of logits, with its logprobs when asked.

Per row, in order: the grammar mask, logit_bias and penalties (`penalties.py`), then greedy
(argmax) or temperature, top_p and a draw (`draw.py`); logprobs come from the logits before
temperature (`logprobs.py`). A batch of plain greedy rows (no mask, penalty, bias or logprobs:
the common decode step) costs one argmax.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engine.sampling.draw import sample
from engine.sampling.logprobs import TopLogprobs, token_logprobs
from engine.sampling.mask import apply_token_bitmask
from engine.sampling.penalties import TokenIds, apply_penalties
from engine.scheduler import SamplingParams


@dataclass(frozen=True, slots=True)
class Row:
    """One sequence's share of a step. The token ids matter only for penalties: the prompt
    for the repetition penalty (pass a cached tensor for long prompts), the output so far for
    all of them."""

    params: SamplingParams
    generator: torch.Generator | None = None  # `make_generator(params)`, kept per request
    prompt_ids: TokenIds = ()
    output_ids: TokenIds = ()


@dataclass(frozen=True, slots=True)
class Sampled:
    token: int
    logprob: float | None = None  # None when params.logprobs is None
    top: TopLogprobs = ()  # () when params.logprobs is None


class NoTokenAllowed(ValueError):
    """The grammar mask leaves these rows no token: a failed matcher (GrammarBackend.fill
    gives it none, where llguidance would allow only EOS). Raised before any penalty or bias
    is applied (the mask is idempotent), so the caller can drop those rows and sample the
    others again."""

    def __init__(self, rows: Sequence[int]) -> None:
        self.rows = tuple(rows)
        super().__init__(f"the grammar mask allows no token in rows {list(self.rows)}")


def sample_rows(
    logits: torch.Tensor, rows: Sequence[Row], bitmask: torch.Tensor | None = None
) -> list[Sampled]:
    """One token for each row of the (B, V) `logits`.

    `bitmask` is llguidance's packed token bitmask (see `mask.py`), or None when no row has a
    grammar. When a row needs processing (a mask, a penalty or a bias), a float32 `logits` is
    changed in place, inference tensors too (the leader's is its own, fresh each step); other
    dtypes are copied.
    """
    if logits.dim() != 2 or logits.shape[0] != len(rows):
        raise ValueError(f"logits of shape {tuple(logits.shape)} for {len(rows)} rows")
    with torch.inference_mode():  # the model's logits may be inference tensors: edit them
        if bitmask is not None or any(row.params.penalized for row in rows):
            logits = _process(logits.float(), rows, bitmask)
        tokens: list[int] = logits.argmax(dim=-1).tolist()  # greedy rows' tokens: the argmax
        for i, row in enumerate(rows):
            if row.params.temperature > 0:
                tokens[i] = sample(logits[i], row.params, row.generator)
        return _with_logprobs(logits, rows, tokens)


def _process(
    logits: torch.Tensor, rows: Sequence[Row], bitmask: torch.Tensor | None
) -> torch.Tensor:
    if bitmask is not None:
        apply_token_bitmask(logits, bitmask)
        dead = torch.isneginf(logits.amax(dim=-1)).nonzero().flatten().tolist()
        if dead:
            raise NoTokenAllowed(dead)
    for i, row in enumerate(rows):
        if row.params.penalized:
            apply_penalties(logits[i], row.params, row.prompt_ids, row.output_ids)
    return logits


def _with_logprobs(logits: torch.Tensor, rows: Sequence[Row], tokens: list[int]) -> list[Sampled]:
    wanted = [i for i, row in enumerate(rows) if row.params.logprobs is not None]
    if not wanted:
        return [Sampled(token) for token in tokens]
    ks = [rows[i].params.logprobs or 0 for i in wanted]
    found = token_logprobs(logits[wanted], [tokens[i] for i in wanted], ks)
    out = [Sampled(token) for token in tokens]
    for i, (logprob, top) in zip(wanted, found, strict=True):
        out[i] = Sampled(tokens[i], logprob, top)
    return out
