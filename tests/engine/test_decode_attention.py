"""Decode attention over the paged cache (`engine.model.decode_attention`, the C kernel).

The oracle is torch: the same rotation (`Angles.rotate`), the keys and values written with
index assignment, each entry's blocks gathered and one masked SDPA. The kernel must write
exactly torch's rotated keys and the values, and attend to the same outputs up to the order
of the sums, on each of its paths (AVX2 where the CPU has it, and the portable one), for
scattered and shared blocks, ragged lengths on and off block boundaries, and grouped heads.
"""

from __future__ import annotations

import pytest
import torch

from engine.model import ModelConfig, decode_attention, init_from_seed, kernels
from engine.model.transformer import Angles

BLOCK = 16


def setup(
    heads: int, kv_heads: int, dim: int, lengths: list[int], seed: int = 0
) -> dict[str, torch.Tensor]:
    """A cache of 80 blocks of random keys and values, tables scattered over it (the first
    block shared by every entry, as a common prefix is), and each entry's new q, k, v packed
    as a model's qkv projection gives them, with its position's angles."""
    gen = torch.Generator().manual_seed(seed)
    batch = len(lengths)
    width = max((n + BLOCK - 1) // BLOCK for n in lengths)
    cache_rows = 80 * BLOCK
    order = torch.randperm(79, generator=gen) + 1
    tables = torch.cat(
        [
            torch.zeros(batch, 1, dtype=torch.int64),
            order[: batch * (width - 1)].view(batch, width - 1),
        ],
        1,
    )
    positions = torch.tensor(lengths) - 1
    rows = tables.gather(1, (positions // BLOCK)[:, None])[:, 0] * BLOCK + positions % BLOCK
    theta = 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim))
    freqs = torch.outer(positions.float(), theta)
    emb = torch.cat((freqs, freqs), -1)
    return {
        "qkv": torch.randn(batch, heads + 2 * kv_heads, dim, generator=gen),
        "keys": torch.randn(cache_rows, kv_heads, dim, generator=gen),
        "values": torch.randn(cache_rows, kv_heads, dim, generator=gen),
        "tables": tables,
        "lengths": torch.tensor(lengths),
        "rows": rows,
        "cos": emb.cos()[:, None],
        "sin": emb.sin()[:, None],
    }


def by_torch(case: dict[str, torch.Tensor], heads: int, kv_heads: int) -> tuple[torch.Tensor, ...]:
    """(outputs, keys, values) the torch way."""
    angles = Angles(case["cos"], case["sin"])
    qk = angles.rotate(case["qkv"][:, : heads + kv_heads])
    keys, values = case["keys"].clone(), case["values"].clone()
    keys[case["rows"]] = qk[:, heads:]
    values[case["rows"]] = case["qkv"][:, heads + kv_heads :]
    paged = (-1, BLOCK, *keys.shape[1:])
    flat = case["tables"].reshape(-1)
    shape = (len(flat) // case["tables"].shape[1], -1, *keys.shape[1:])
    gathered_k = keys.view(paged)[flat].view(shape)
    gathered_v = values.view(paged)[flat].view(shape)
    mask = decode_attention.visible(case["tables"], case["lengths"], BLOCK)
    out = decode_attention.attend_gathered(qk[:, :heads], gathered_k, gathered_v, mask)
    return out, keys, values


def by_kernel(
    case: dict[str, torch.Tensor], heads: int, kv_heads: int, path: str, rotated: bool = False
) -> tuple[torch.Tensor, ...]:
    """(outputs, keys, values) by the kernel; `rotated`: q and k rotated by torch first."""
    keys, values = case["keys"].clone(), case["values"].clone()
    qkv = case["qkv"]
    angles: tuple[torch.Tensor, torch.Tensor] | None = (case["cos"], case["sin"])
    q, k = qkv[:, :heads], qkv[:, heads : heads + kv_heads]
    if rotated:
        qk = Angles(case["cos"], case["sin"]).rotate(qkv[:, : heads + kv_heads])
        q, k, angles = qk[:, :heads], qk[:, heads:], None
    step = decode_attention.Step(case["rows"], case["tables"], case["lengths"], BLOCK, angles, path)
    out = step(q, k, qkv[:, heads + kv_heads :], (keys, values))
    return out, keys, values


SHAPES = [(9, 3, 64), (4, 4, 32), (8, 1, 64), (6, 2, 24), (4, 2, 128)]  # heads, kv, dim


@pytest.mark.parametrize("path", decode_attention.PATHS)
@pytest.mark.parametrize(("heads", "kv_heads", "dim"), SHAPES)
@pytest.mark.parametrize("rotated", [False, True])
def test_the_kernel_writes_and_attends_as_torch(
    path: str, heads: int, kv_heads: int, dim: int, rotated: bool
) -> None:
    lengths = [1, 16, 17, 33, 70, 5, 48, 100]  # one, block ends, one past, ragged
    case = setup(heads, kv_heads, dim, lengths)
    expected, keys, values = by_torch(case, heads, kv_heads)
    out, got_keys, got_values = by_kernel(case, heads, kv_heads, path, rotated)
    # The same products and sums as torch's rotation: the written keys are equal, bit for bit.
    assert torch.equal(got_keys, keys) and torch.equal(got_values, values)
    torch.testing.assert_close(out, expected, atol=2e-6, rtol=1e-5)


def test_one_step_serves_every_layer() -> None:
    """A model plans a step once and calls it for each layer's cache and new q, k, v."""
    cases = [setup(9, 3, 64, [5, 40, 17], seed=layer) for layer in range(3)]
    first = cases[0]
    step = decode_attention.Step(
        first["rows"], first["tables"], first["lengths"], BLOCK, (first["cos"], first["sin"])
    )
    for case in cases:
        case.update({k: first[k] for k in ("rows", "tables", "lengths", "cos", "sin")})
        keys, values = case["keys"].clone(), case["values"].clone()
        qkv = case["qkv"]
        out = step(qkv[:, :9], qkv[:, 9:12], qkv[:, 12:], (keys, values))
        expected, expected_keys, expected_values = by_torch(case, 9, 3)
        assert torch.equal(keys, expected_keys) and torch.equal(values, expected_values)
        torch.testing.assert_close(out, expected, atol=2e-6, rtol=1e-5)


def test_the_paths_agree_where_the_cpu_has_avx2() -> None:
    case = setup(9, 3, 64, [40, 3, 129])
    best = by_kernel(case, 9, 3, "best")[0]
    portable = by_kernel(case, 9, 3, "portable")[0]
    torch.testing.assert_close(best, portable, atol=2e-6, rtol=1e-5)
    lib = kernels.optional_library("attention")
    assert lib.ug_attend_accelerated(100) == 0  # not a multiple of 8: the portable path
    assert lib.ug_attend_accelerated(256) == 0  # wider than its registers hold


def test_a_scaled_up_query_keeps_its_softmax_finite() -> None:
    """Scores in the thousands: the maximum is subtracted before the exponentials."""
    case = setup(4, 2, 32, [30, 64])
    case["qkv"][:, :4] *= 400
    for path in decode_attention.PATHS:
        out = by_kernel(case, 4, 2, path)[0]
        assert torch.isfinite(out).all()
        torch.testing.assert_close(out, by_torch(case, 4, 2)[0], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"rows": torch.tensor([80 * BLOCK, 0])}, "rows"),
        ({"rows": torch.tensor([-1, 0])}, "rows"),
        ({"tables": torch.tensor([[0, 80], [0, 1]])}, "blocks"),
        ({"lengths": torch.tensor([33, 20])}, "lengths"),
        ({"lengths": torch.tensor([0, 20])}, "lengths"),
    ],
)
def test_out_of_range_rows_blocks_or_lengths_are_refused_before_anything_is_written(
    change: dict[str, torch.Tensor], field: str
) -> None:
    case = {**setup(4, 2, 32, [20, 30]), **change}
    keys, values = case["keys"].clone(), case["values"].clone()
    with pytest.raises(ValueError, match=f"{field}.*nothing was written"):
        by_kernel(case, 4, 2, "best")
    assert torch.equal(case["keys"], keys) and torch.equal(case["values"], values)


def test_bad_arguments_are_named() -> None:
    case = setup(4, 2, 32, [20])
    with pytest.raises(ValueError, match="path: one of"):
        by_kernel(case, 4, 2, "fast")
    half = {**case, "qkv": case["qkv"].half()}
    with pytest.raises(TypeError, match="float32"):
        by_kernel(half, 4, 2, "best")
    with pytest.raises(ValueError, match="heads=3, kv_heads=2"):
        by_kernel(case, 3, 2, "best")  # 3 query heads do not group over 2
    step = decode_attention.Step(case["rows"], case["tables"], case["lengths"], BLOCK)
    two = torch.randn(2, 8, 32)
    with pytest.raises(ValueError, match="2, 2, 2 rows for 1 entries"):
        step(two[:, :4], two[:, 4:6], two[:, 6:], (case["keys"], case["values"]))
    strided = {**case, "keys": case["keys"].transpose(0, 1).contiguous().transpose(0, 1)}
    with pytest.raises(ValueError, match="contiguous"):
        by_kernel(strided, 4, 2, "best")


def test_the_kernel_runs_for_a_float32_cache_where_it_builds() -> None:
    assert decode_attention.available(torch.float32)
    assert not decode_attention.available(torch.float16)


@pytest.mark.usefixtures("no_compiler")
def test_without_a_compiler_the_models_attend_by_torch() -> None:
    assert not decode_attention.available(torch.float32)
    assert not init_from_seed(ModelConfig.tiny(), seed=1).attention_kernel
