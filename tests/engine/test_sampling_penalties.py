"""logit_bias and the repetition, frequency and presence penalties against a plain loop that
spells out the OpenAI and vLLM definitions."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.sampling import apply_penalties
from engine.scheduler import SamplingParams

VOCAB = 12


def reference(
    logits: list[float], params: SamplingParams, prompt: list[int], output: list[int]
) -> list[float]:
    """vLLM's order: logit_bias, then repetition, then frequency and presence."""
    out = list(logits)
    for token, bias in params.logit_bias:
        out[token] += bias
    penalty = params.repetition_penalty
    for token in set(prompt) | set(output):
        out[token] = out[token] / penalty if out[token] > 0 else out[token] * penalty
    for token in set(output):
        count = output.count(token)
        out[token] -= params.frequency_penalty * count + params.presence_penalty * (count > 0)
    return out


@st.composite
def cases(draw: st.DrawFn) -> tuple[list[float], SamplingParams, list[int], list[int]]:
    """A small vocabulary counts ids into it, a larger one sorts them: both ways are drawn."""
    vocab = draw(st.sampled_from([VOCAB, 400]))
    token = st.integers(0, vocab - 1)
    params = SamplingParams(
        presence_penalty=draw(st.floats(-2, 2)),
        frequency_penalty=draw(st.floats(-2, 2)),
        repetition_penalty=draw(st.one_of(st.just(1.0), st.floats(0.1, 5))),
        logit_bias=tuple(sorted(draw(st.dictionaries(token, st.floats(-100, 100))).items())),
    )
    logits = draw(st.lists(st.floats(-30, 30, width=32), min_size=vocab, max_size=vocab))
    return logits, params, draw(st.lists(token, max_size=30)), draw(st.lists(token, max_size=30))


@settings(max_examples=300, deadline=None)
@given(cases())
def test_penalties_match_the_definitions(
    case: tuple[list[float], SamplingParams, list[int], list[int]],
) -> None:
    logits, params, prompt, output = case
    got = apply_penalties(torch.tensor(logits), params, prompt, output)
    want = torch.tensor(reference(logits, params, prompt, output))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)


def test_frequency_counts_every_occurrence_and_presence_counts_once() -> None:
    logits = torch.zeros(4)
    params = SamplingParams(frequency_penalty=0.5, presence_penalty=1.0)
    apply_penalties(logits, params, prompt_ids=[3, 3], output_ids=[1, 1, 1, 2])
    assert logits.tolist() == [0.0, -2.5, -1.5, 0.0]  # the prompt does not count


def test_repetition_divides_positive_and_multiplies_negative_logits() -> None:
    logits = torch.tensor([2.0, -2.0, 2.0, 0.0])
    apply_penalties(logits, SamplingParams(repetition_penalty=2.0), [0, 3], [1])
    assert logits.tolist() == [1.0, -4.0, 2.0, 0.0]  # token 2 never occurred


def test_logit_bias_comes_before_the_repetition_penalty() -> None:
    params = SamplingParams(repetition_penalty=2.0, logit_bias=((0, 2.0),))
    assert apply_penalties(torch.tensor([2.0]), params, [0]).tolist() == [2.0]  # (2 + 2) / 2


def test_penalties_accept_a_cached_prompt_tensor_and_change_the_row_in_place() -> None:
    logits = torch.tensor([3.0, 3.0])
    out = apply_penalties(logits, SamplingParams(repetition_penalty=3.0), torch.tensor([1]))
    assert out is logits and logits.tolist() == [3.0, 1.0]


@pytest.mark.parametrize(
    ("params", "prompt", "output", "message"),
    [
        (SamplingParams(logit_bias=((4, 1.0),)), [], [], "logit_bias token id 4"),
        (SamplingParams(repetition_penalty=1.5), [9], [], "prompt token id 9"),
        (SamplingParams(presence_penalty=1.0), [], [0, 7], "output token id 7"),
    ],
)
def test_a_token_id_outside_the_vocabulary_is_named(
    params: SamplingParams, prompt: list[int], output: list[int], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        apply_penalties(torch.zeros(4), params, prompt, output)
