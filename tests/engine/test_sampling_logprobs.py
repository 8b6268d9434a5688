"""The sampled token's logprob and the top-k list: sorted, never a masked-out token, and
always holding the sampled token."""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.sampling import token_logprobs

VOCAB = 10


@st.composite
def rows(draw: st.DrawFn) -> tuple[list[float], int, int]:
    """Logits with some tokens masked out (-inf), an allowed token and a k."""
    logits = draw(st.lists(st.floats(-20, 20), min_size=VOCAB, max_size=VOCAB))
    masked = draw(st.sets(st.integers(0, VOCAB - 1), max_size=VOCAB - 1))
    logits = [-math.inf if i in masked else x for i, x in enumerate(logits)]
    token = draw(st.sampled_from([i for i in range(VOCAB) if i not in masked]))
    return logits, token, draw(st.integers(0, VOCAB + 2))


@settings(max_examples=300, deadline=None)
@given(st.lists(rows(), min_size=1, max_size=4))
def test_top_lists_are_sorted_allowed_and_hold_the_sampled_token(
    batch: list[tuple[list[float], int, int]],
) -> None:
    logits = torch.tensor([row for row, _, _ in batch])
    tokens = [token for _, token, _ in batch]
    ks = [k for _, _, k in batch]
    want = torch.log_softmax(logits, dim=-1)
    for i, (logprob, top) in enumerate(token_logprobs(logits, tokens, ks)):
        assert logprob <= 0 and math.isclose(logprob, float(want[i, tokens[i]]), abs_tol=1e-6)
        values = [value for _, value in top]
        assert values == sorted(values, reverse=True)
        assert all(value > -math.inf for value in values)
        assert (tokens[i], logprob) in top
        assert len({t for t, _ in top}) == len(top)
        for t, value in top:
            assert math.isclose(value, float(want[i, t]), abs_tol=1e-6)
        allowed = int(torch.isfinite(logits[i]).sum())
        assert len(top) in (min(ks[i], allowed), min(ks[i], allowed) + 1)
        # what the list leaves out is no more likely than what it holds
        if len(top) >= ks[i] and ks[i]:
            left_out = [float(want[i, t]) for t in range(VOCAB) if t not in dict(top)]
            assert max(left_out, default=-math.inf) <= values[ks[i] - 1]


def test_an_unlikely_sampled_token_is_inserted_in_its_sorted_place() -> None:
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0]])
    ((_, top),) = token_logprobs(logits, [3], [2])
    assert [t for t, _ in top] == [0, 1, 3]
    ((_, top),) = token_logprobs(logits, [1], [2])
    assert [t for t, _ in top] == [0, 1]  # already among the top 2: k entries
    ((_, top),) = token_logprobs(logits, [4], [0])
    assert [t for t, _ in top] == [4]  # k = 0: just the sampled token


def test_fewer_allowed_tokens_than_k_give_a_shorter_list() -> None:
    logits = torch.tensor([[1.0, -math.inf, 0.5, -math.inf]])
    ((_, top),) = token_logprobs(logits, [2], [4])
    assert [t for t, _ in top] == [0, 2]
    assert math.isclose(math.exp(top[0][1]) + math.exp(top[1][1]), 1.0, rel_tol=1e-6)
