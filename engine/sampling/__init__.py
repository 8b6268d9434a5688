"""Sampling on the leader (followers never sample): grammar masks, logit_bias and penalties,
greedy or temperature/top_p draws, and logprobs, as pure functions over a batch of logits."""

from engine.sampling.draw import make_generator, sample, top_p_filter
from engine.sampling.logprobs import TopLogprobs, token_logprobs
from engine.sampling.mask import apply_token_bitmask
from engine.sampling.penalties import TokenIds, apply_penalties
from engine.sampling.sampler import NoTokenAllowed, Row, Sampled, sample_rows

__all__ = [
    "NoTokenAllowed",
    "Row",
    "Sampled",
    "TokenIds",
    "TopLogprobs",
    "apply_penalties",
    "apply_token_bitmask",
    "make_generator",
    "sample",
    "sample_rows",
    "token_logprobs",
    "top_p_filter",
]
