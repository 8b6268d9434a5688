"""Penalties and logit_bias on one row of logits, as vLLM applies them.

Order (vLLM v1's sampler): logit_bias, then the repetition penalty, then frequency and
presence. Only a token carrying both a bias and a repetition penalty sees the difference.

- logit_bias: `logit[t] += bias` (OpenAI).
- repetition (vLLM/HF, over prompt and output tokens): a positive logit is divided by the
  penalty, any other multiplied by it.
- frequency and presence (OpenAI, over output tokens only):
  `logit[t] -= frequency * count[t] + presence * (count[t] > 0)`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from engine.scheduler import SamplingParams

# A cached tensor spares converting a long prompt on every step.
TokenIds = Sequence[int] | torch.Tensor


def apply_penalties(
    logits: torch.Tensor,
    params: SamplingParams,
    prompt_ids: TokenIds = (),
    output_ids: TokenIds = (),
) -> torch.Tensor:
    """Apply `params`' bias and penalties to a (V,) row in place; returns the row.

    Raises ValueError naming a token id outside the row's vocabulary (the server checks
    ids against the vocabulary first: here it would be a bug, not a client error).
    """
    if params.logit_bias:
        _add_bias(logits, params.logit_bias)
    repetition = params.repetition_penalty != 1
    frequency, presence = params.frequency_penalty, params.presence_penalty
    if not (repetition or frequency or presence):
        return logits
    output = _ids(output_ids, logits, "output")
    if repetition:
        seen = torch.cat([_ids(prompt_ids, logits, "prompt"), output])
        _repetition(logits, seen, params.repetition_penalty)
    if frequency or presence:
        _frequency_presence(logits, output, frequency, presence)
    return logits


def _add_bias(logits: torch.Tensor, bias: Sequence[tuple[int, float]]) -> None:
    ids = _ids([token for token, _ in bias], logits, "logit_bias")
    values = torch.tensor([value for _, value in bias], dtype=logits.dtype)
    logits.index_add_(0, ids, values)


def _repetition(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> None:
    ids, _ = _distinct(seen, logits.numel())
    values = logits[ids]
    logits[ids] = torch.where(values > 0, values / penalty, values * penalty)


def _frequency_presence(
    logits: torch.Tensor, output: torch.Tensor, frequency: float, presence: float
) -> None:
    ids, counts = _distinct(output, logits.numel())
    logits.index_add_(0, ids, counts.to(logits.dtype) * -frequency - presence)


def _distinct(ids: torch.Tensor, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each distinct id once, with its count. Sorting a few ids is cheaper than a pass over
    the vocabulary; for many (a long prompt), counting into the vocabulary is."""
    if ids.numel() * 8 < vocab:
        distinct, counts = torch.unique(ids, return_counts=True)
        return distinct, counts
    counts = torch.bincount(ids, minlength=vocab)
    distinct = counts.nonzero().squeeze(1)
    return distinct, counts[distinct]


def _ids(ids: TokenIds, logits: torch.Tensor, what: str) -> torch.Tensor:
    """`ids` as an int64 tensor, each one checked against the vocabulary."""
    if isinstance(ids, torch.Tensor):
        tensor = ids.to(torch.int64).reshape(-1)
    else:  # numpy converts a list of ints several times faster than torch.tensor
        tensor = torch.from_numpy(np.fromiter(ids, dtype=np.int64, count=len(ids)))
    if tensor.numel():
        low, high = (int(bound) for bound in torch.aminmax(tensor))
        vocab = logits.numel()
        if low < 0 or high >= vocab:
            bad = low if low < 0 else high
            raise ValueError(f"{what} token id {bad} is outside the vocabulary (size {vocab})")
    return tensor
