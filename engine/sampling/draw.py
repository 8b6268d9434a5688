"""Drawing one row's token: greedy at temperature 0, else temperature, then nucleus (top_p).

A seeded request draws from its own generator, so its tokens do not depend on which other
requests share its batches."""

from __future__ import annotations

import torch

from engine.scheduler import SamplingParams


def make_generator(params: SamplingParams, index: int = 0) -> torch.Generator | None:
    """A per-request generator for a seeded, sampled request; None draws from torch's global
    generator (and greedy requests draw nothing). Choice `index` of n draws from seed + index
    (as vLLM does), so the choices of one seed differ and repeat across requests."""
    if params.seed is None or params.temperature == 0:
        return None
    return torch.Generator().manual_seed((params.seed + index) % 2**64)


def sample(
    logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None = None
) -> int:
    """One (V,) row: argmax at temperature 0; otherwise temperature, then top_p, then a draw.
    Tokens at -inf (masked out) have probability 0 and are never drawn."""
    if params.temperature == 0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits.float() / params.temperature, dim=-1)
    if params.top_p < 1:
        probs = top_p_filter(probs, params.top_p)
    return int(torch.multinomial(probs, 1, generator=generator))


def top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches top_p (at least one)."""
    sorted_probs, order = probs.sort(descending=True)
    mass_before = sorted_probs.cumsum(-1) - sorted_probs
    sorted_probs = sorted_probs.masked_fill(mass_before >= top_p, 0.0)
    kept = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
    return kept / kept.sum()
