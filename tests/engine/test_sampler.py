"""The batch sampler: the plain greedy fast path, grammar masks, seeded rows that ignore their
neighbours, logprobs, and the leader's former entry point."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.sampling import (
    NoTokenAllowed,
    Row,
    apply_token_bitmask,
    make_generator,
    sample_rows,
)
from engine.scheduler import SamplingParams

GREEDY = SamplingParams(temperature=0)
VOCAB = 100


def random_logits(batch: int, vocab: int = VOCAB, seed: int = 0) -> torch.Tensor:
    return torch.randn(batch, vocab, generator=torch.Generator().manual_seed(seed)) * 3


def bitmask_allowing(allowed: list[set[int]], vocab: int = VOCAB) -> torch.Tensor:
    mask = torch.zeros(len(allowed), (vocab + 31) // 32, dtype=torch.int32)
    for row, tokens in enumerate(allowed):
        for token in tokens:
            word = int(mask[row, token // 32]) | (1 << (token % 32))
            mask[row, token // 32] = word - (1 << 32) if word >= 1 << 31 else word
    return mask


def seeded_row(params: SamplingParams) -> Row:
    return Row(params, make_generator(params))


# -- the fast path --


def test_plain_greedy_rows_take_the_argmax_and_leave_the_logits_alone() -> None:
    logits = random_logits(8)
    before = logits.clone()
    got = sample_rows(logits, [Row(GREEDY)] * 8)
    assert [s.token for s in got] == logits.argmax(dim=-1).tolist()
    assert all(s.logprob is None and s.top == () for s in got)
    assert torch.equal(logits, before)


def test_inference_tensors_are_processed_outside_inference_mode() -> None:
    with torch.inference_mode():
        logits = random_logits(2)  # as the model returns them
    rows = [Row(SamplingParams(temperature=0, logit_bias=((7, 100.0),)))] * 2
    assert [s.token for s in sample_rows(logits, rows)] == [7, 7]


def test_the_fast_path_agrees_with_the_general_path() -> None:
    """A mask allowing everything sends the same greedy batch down the general path."""
    logits = random_logits(8)
    everything = torch.full((8, (VOCAB + 31) // 32), -1, dtype=torch.int32)
    fast = sample_rows(logits.clone(), [Row(GREEDY)] * 8)
    general = sample_rows(logits.clone(), [Row(GREEDY)] * 8, everything)
    assert fast == general


# -- grammar masks --


def test_a_masked_token_is_never_drawn_and_greedy_respects_the_mask() -> None:
    logits = torch.zeros(1, VOCAB)
    logits[0, :10] = 5.0  # the likeliest tokens are the masked ones
    allowed = {10, 11, 50, 99}
    params = SamplingParams(temperature=1.0, seed=3)
    row = seeded_row(params)
    drawn = {
        sample_rows(logits.clone(), [row], bitmask_allowing([allowed]))[0].token for _ in range(500)
    }
    assert drawn == allowed
    logits[0, 50] = 1.0
    assert sample_rows(logits, [Row(GREEDY)], bitmask_allowing([allowed]))[0].token == 50


@settings(max_examples=100, deadline=None)
@given(
    st.integers(1, 130),
    st.integers(1, 6),
    st.lists(st.integers(-(2**31), 2**31 - 1), min_size=6, max_size=6),
)
def test_the_bitmask_unpacks_bit_j_of_word_i_to_token_32i_plus_j(
    vocab: int, words: int, values: list[int]
) -> None:
    """Narrower masks than the vocabulary disallow the rest; wider ones are cut."""
    bitmask = torch.tensor([values[:words]], dtype=torch.int32)
    logits = torch.randn(1, vocab)
    original = logits.clone()
    apply_token_bitmask(logits, bitmask)
    for token in range(vocab):
        word = token // 32
        allowed = word < words and (values[word] >> (token % 32)) & 1
        want = original[0, token] if allowed else -math.inf
        assert logits[0, token] == want


def test_a_row_the_mask_leaves_no_token_is_named() -> None:
    mask = bitmask_allowing([{1}, set(), {2}, set()])
    with pytest.raises(NoTokenAllowed) as caught:
        sample_rows(random_logits(4), [Row(GREEDY)] * 4, mask)
    assert caught.value.rows == (1, 3)


def test_a_malformed_bitmask_is_rejected() -> None:
    with pytest.raises(ValueError, match="bitmask must be int32"):
        sample_rows(random_logits(2), [Row(GREEDY)] * 2, torch.full((1, 4), -1))


# -- seeds, penalties and logprobs --


def test_a_seeded_row_ignores_its_neighbours() -> None:
    params = SamplingParams(temperature=1.0, top_p=0.9, seed=7)
    neighbours = [
        Row(SamplingParams(temperature=0.8)),
        Row(GREEDY),
        seeded_row(SamplingParams(temperature=1.2, seed=1, presence_penalty=1.0)),
        Row(SamplingParams(temperature=1.0, logprobs=2)),
    ]

    def run(batch_size: int) -> list[int]:
        row = seeded_row(params)
        tokens = []
        for step in range(20):
            others = random_logits(batch_size - 1, seed=100 + step)
            logits = torch.cat([random_logits(1, seed=step), others])
            batch = [row, *neighbours[: batch_size - 1]]
            tokens.append(sample_rows(logits, batch)[0].token)
        return tokens

    alone = run(1)
    assert run(5) == run(3) == alone
    assert len(set(alone)) > 1  # actually sampling


def test_penalties_and_bias_steer_the_choice() -> None:
    logits = torch.tensor([[3.0, 2.0, 1.0], [3.0, 2.0, 1.0]])
    rows = [
        Row(SamplingParams(temperature=0, logit_bias=((2, 5.0),))),
        Row(SamplingParams(temperature=0, frequency_penalty=1.0), output_ids=[0, 0]),
    ]
    assert [s.token for s in sample_rows(logits, rows)] == [2, 1]


def test_logprobs_come_only_when_asked_and_greedy_is_the_likeliest() -> None:
    logits = random_logits(3)
    rows = [
        Row(SamplingParams(temperature=0, logprobs=3, presence_penalty=2.0), output_ids=[5]),
        Row(GREEDY),
        seeded_row(SamplingParams(temperature=1.0, seed=0, logprobs=0)),
    ]
    greedy, plain, drawn = sample_rows(logits, rows)
    assert greedy.logprob is not None and greedy.logprob <= 0
    assert len(greedy.top) == 3 and greedy.top[0] == (greedy.token, greedy.logprob)
    assert plain.logprob is None and plain.top == ()
    assert drawn.top == ((drawn.token, drawn.logprob),)
