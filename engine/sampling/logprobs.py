"""Logprobs of the sampled token and of the most likely ones (OpenAI's `logprobs`).

Taken from the processed logits (after logit_bias, penalties and the grammar mask) but BEFORE
temperature and top_p: they describe the model as steered by the request, not the tempered
distribution a token was drawn from, so greedy's token is always the most likely.
(vLLM's default, `raw_logprobs`, is before any processing.)
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence

import torch

TopLogprobs = tuple[tuple[int, float], ...]


def token_logprobs(
    logits: torch.Tensor, tokens: Sequence[int], ks: Sequence[int]
) -> list[tuple[float, TopLogprobs]]:
    """For each row of the (N, V) `logits`: its token's logprob and the `ks[row]` most likely
    (token, logprob), most likely first.

    The sampled token is always in the list: when not among the k most likely it is inserted
    in its sorted place, so a list holds k or k + 1 entries (vLLM does the same). Tokens at
    -inf (masked out) are never listed, so with fewer than k allowed tokens the list is
    shorter.
    """
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    chosen = logprobs.gather(1, torch.tensor(tokens, dtype=torch.int64).unsqueeze(1))
    k = min(max(ks, default=0), logprobs.shape[-1])
    values, ids = logprobs.topk(k, dim=-1)
    rows = zip(tokens, chosen.squeeze(1).tolist(), ks, ids.tolist(), values.tolist(), strict=True)
    return [
        (logprob, _top(token, logprob, list(zip(top_ids[:want], top_values[:want], strict=True))))
        for token, logprob, want, top_ids, top_values in rows
    ]


def _top(token: int, logprob: float, top: list[tuple[int, float]]) -> TopLogprobs:
    top = [(t, value) for t, value in top if value != -math.inf]
    if all(t != token for t, _ in top):
        # after any equal logprob: the list stays sorted, ties keep topk's order
        at = bisect.bisect_right([-value for _, value in top], -logprob)
        top.insert(at, (token, logprob))
    return tuple(top)
