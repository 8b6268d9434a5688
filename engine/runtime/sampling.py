"""Turning one entry's logits into a token, on the leader only (followers never sample)."""

from __future__ import annotations

import torch

from engine.scheduler import SamplingParams


def make_generator(params: SamplingParams) -> torch.Generator | None:
    """A per-request generator for a seeded request, so its output does not depend on which
    other requests shared its batches; None draws from torch's global generator."""
    if params.seed is None or params.temperature == 0:
        return None
    return torch.Generator().manual_seed(params.seed)


def sample(
    logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None = None
) -> int:
    """Greedy at temperature 0; otherwise temperature, then nucleus (top_p) sampling."""
    if params.temperature == 0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits.float() / params.temperature, dim=-1)
    if params.top_p < 1:
        probs = top_p_filter(probs, params.top_p)
    return int(torch.multinomial(probs, 1, generator=generator))


def sample_batch(
    logits: torch.Tensor, requests: list[tuple[SamplingParams, torch.Generator | None]]
) -> list[int]:
    """One argmax over the whole batch for the greedy rows (the common case), so a decode
    step does not pay a tensor call per sequence; sampled rows go one by one."""
    greedy = logits.argmax(dim=-1).tolist()
    return [
        int(greedy[i]) if params.temperature == 0 else sample(logits[i], params, generator)
        for i, (params, generator) in enumerate(requests)
    ]


def top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches top_p (at least one)."""
    sorted_probs, order = probs.sort(descending=True)
    mass_before = sorted_probs.cumsum(-1) - sorted_probs
    sorted_probs = sorted_probs.masked_fill(mass_before >= top_p, 0.0)
    kept = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
    return kept / kept.sum()
