"""RMSNorm and the residual add before it (`engine.model.norm`, the C kernel).

The oracle is torch: `x + residual` for the sum (which the kernel must give exactly: it is the
residual stream every later layer adds to) and `nn.functional.rms_norm` for the norm, which
the kernel's paths (AVX2 where the CPU has it, and the portable one) must match up to the
order of the sums."""

from __future__ import annotations

import pytest
import torch

from engine.model import ModelConfig, init_from_seed, norm
from engine.model.norm import RMSNorm

KERNEL_PATHS = [p for p in norm.PATHS if p != "torch"]


def made(cols: int, path: str, seed: int = 0) -> RMSNorm:
    module = RMSNorm(cols, 1e-5)
    module.weight.copy_(torch.randn(cols, generator=torch.Generator().manual_seed(seed)))
    module.use(path)
    return module


@pytest.mark.parametrize("path", KERNEL_PATHS)
@pytest.mark.parametrize("cols", [576, 64, 8, 60, 5])  # 60 and 5: not whole AVX2 registers
@pytest.mark.parametrize("rows", [1, 4, 9])
def test_the_kernel_norms_and_adds_as_torch(path: str, cols: int, rows: int) -> None:
    gen = torch.Generator().manual_seed(cols * 100 + rows)
    x = torch.randn(rows, cols, generator=gen) * 3
    residual = torch.randn(rows, cols, generator=gen)
    kernel, reference = made(cols, path), made(cols, "torch")
    torch.testing.assert_close(kernel(x), reference(x), atol=2e-6, rtol=1e-5)
    normed, total = kernel.add(x, residual)
    expected_normed, expected_total = reference.add(x, residual)
    assert torch.equal(total, x + residual) and torch.equal(expected_total, x + residual)
    torch.testing.assert_close(normed, expected_normed, atol=2e-6, rtol=1e-5)


def test_a_batch_of_sequences_is_normed_row_by_row() -> None:
    """(batch, tokens, cols): each row on its own, as torch does over the last dimension."""
    x = torch.randn(2, 3, 64)
    torch.testing.assert_close(made(64, "best")(x), made(64, "torch")(x), atol=2e-6, rtol=1e-5)


def test_narrower_activations_take_torchs_way() -> None:
    x = torch.randn(2, 64, dtype=torch.float16)
    kernel, reference = made(64, "best"), made(64, "torch")
    kernel.weight.data = kernel.weight.data.half()
    reference.weight.data = reference.weight.data.half()
    assert torch.equal(kernel(x), reference(x))


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="path: one of"):
        made(64, "fast")
    with pytest.raises(ValueError, match="rows of 32 for a norm of"):
        made(64, "best")(torch.randn(2, 32))
    with pytest.raises(ValueError, match="residual"):
        made(64, "best").add(torch.randn(2, 64), torch.randn(3, 64))


def test_a_model_gives_the_same_logits_with_the_kernel_or_torch() -> None:
    config = ModelConfig.tiny()
    prompt = [(0, [5, 9, 2, 7], 0), (1, [3], 0)]
    with_kernel = init_from_seed(config, seed=1)
    assert with_kernel.norm_kernel
    without = init_from_seed(config, seed=1)
    for module in without.modules():
        if isinstance(module, RMSNorm):
            module.use("torch")
    torch.testing.assert_close(with_kernel(prompt), without(prompt), atol=1e-5, rtol=1e-5)


def test_the_kernel_runs_for_float32_where_it_builds() -> None:
    assert norm.available(torch.float32)
    assert not norm.available(torch.bfloat16)


@pytest.mark.usefixtures("no_compiler")
def test_without_a_compiler_the_models_norm_by_torch() -> None:
    assert not norm.available(torch.float32)
    assert not init_from_seed(ModelConfig.tiny(), seed=1).norm_kernel
