"""Weights stored in float16, arithmetic in float32 (`engine.model.narrow`).

Two paths: a few rows multiply in float16 (inputs rounded, float32 accumulation), more rows
widen the weight into float32 and multiply exactly as a float32 weight of the same values
would. A float16 overflow must never reach the logits.
"""

from __future__ import annotations

import threading

import pytest
import torch
from torch import nn

from engine.model import ModelConfig, Transformer, init_from_seed, narrow
from engine.model.parallel import ColumnParallelLinear


@pytest.fixture
def weight() -> torch.Tensor:
    return (torch.randn(96, 64, generator=torch.Generator().manual_seed(0)) * 0.1).half()


def rows(n: int) -> torch.Tensor:
    return torch.randn(n, 64, generator=torch.Generator().manual_seed(n))


def assert_float32_close(out: torch.Tensor, exact: torch.Tensor) -> None:
    """float32 arithmetic on the same values: equal up to the kernel's summation order (a
    float16 input rounding is ~1e-3 here, so this tells the two paths apart)."""
    torch.testing.assert_close(out, exact, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("n", [narrow.NARROW_ROWS + 1, 8, 33])
def test_many_rows_multiply_the_widened_weight_exactly(weight: torch.Tensor, n: int) -> None:
    x = rows(n)
    out = narrow.linear(x, weight)
    assert out.dtype == torch.float32
    assert_float32_close(out, nn.functional.linear(x, weight.float()))


@pytest.mark.parametrize("n", range(1, narrow.NARROW_ROWS + 1))
def test_few_rows_multiply_in_float16_within_its_rounding(weight: torch.Tensor, n: int) -> None:
    x = rows(n)
    out = narrow.linear(x, weight)
    exact = nn.functional.linear(x, weight.float())
    assert out.dtype == torch.float32
    assert float((out - exact).abs().max()) > 1e-5  # the float16 path ran (inputs rounded)
    torch.testing.assert_close(out, exact, rtol=2e-3, atol=2e-3)


def test_widened_forces_the_exact_path_for_one_row(weight: torch.Tensor) -> None:
    x = rows(1)
    with narrow.widened():
        out = narrow.linear(x, weight)
    assert_float32_close(out, nn.functional.linear(x, weight.float()))
    assert float((narrow.linear(x, weight) - out).abs().max()) > 1e-5  # and only within


def test_weights_wider_than_a_chunk_are_widened_in_parts(
    weight: torch.Tensor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The LM head (49,152 rows) never widens whole: 10 rows of 64 per chunk here."""
    monkeypatch.setattr(narrow, "CHUNK_ELEMENTS", 640)
    x = rows(8)
    assert_float32_close(narrow.linear(x, weight), nn.functional.linear(x, weight.float()))


def test_same_dtype_is_a_plain_linear(weight: torch.Tensor) -> None:
    x = rows(2).half()
    assert torch.equal(narrow.linear(x, weight), nn.functional.linear(x, weight))


def model(weight_dtype: torch.dtype | None = None) -> Transformer:
    return init_from_seed(ModelConfig.tiny(), seed=5, num_slots=2, weight_dtype=weight_dtype)


def test_matrices_and_embedding_are_stored_narrow_the_rest_float32() -> None:
    m = model(torch.float16)
    for name, module in m.named_modules():
        if isinstance(module, ColumnParallelLinear) or name.endswith(("o_proj", "down_proj")):
            assert module.weight.dtype == torch.float16, name
    assert m.embed_tokens.weight.dtype == torch.float16
    assert m.lm_head.weight.dtype == torch.float16
    assert m.norm.weight.dtype == torch.float32
    assert m.cache.k.dtype == torch.float32
    wide = sum(p.numel() * p.element_size() for p in model().parameters())
    assert sum(p.numel() * p.element_size() for p in m.parameters()) < 0.51 * wide


def test_logits_follow_the_float32_model() -> None:
    wide, narrowed = model(), model(torch.float16)
    prompt = [(0, list(range(3, 40)), 0)]
    torch.testing.assert_close(narrowed(prompt), wide(prompt), rtol=0, atol=2e-3)
    step = [(0, [7], 37)]
    torch.testing.assert_close(narrowed(step), wide(step), rtol=0, atol=2e-3)


def test_a_float16_overflow_reruns_the_step_widened() -> None:
    """Activations beyond float16's range (65,504) would become inf, then NaN logits; the
    step is run again widened instead, rewriting the same cache positions."""
    m, reference = model(torch.float16), model(torch.float16)
    for each in (m, reference):
        each([(0, list(range(3, 20)), 0)])
        with torch.no_grad():
            each.layers[1].post_attention_layernorm.weight.mul_(1e5)
    big = m.layers[1].post_attention_layernorm(torch.ones(1, m.config.hidden_size))
    assert not torch.isfinite(narrow.linear(big, m.layers[1].mlp.gate_up_proj.weight)).all()
    logits = m([(0, [9], 17)])
    assert torch.isfinite(logits).all()
    with narrow.widened():
        assert_float32_close(logits, reference([(0, [9], 17)]))


def test_the_scratch_buffer_outlives_inference_mode(
    weight: torch.Tensor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """First widened inside a forward (inference_mode), then used outside one."""
    monkeypatch.setattr(narrow, "_local", threading.local())  # no buffer yet in this thread
    x = rows(8)
    with torch.inference_mode():
        inside = narrow.linear(x, weight.clone() * 2)
    assert_float32_close(narrow.linear(x, weight), nn.functional.linear(x, weight.float()))
    assert_float32_close(inside, nn.functional.linear(x, weight.float() * 2))
