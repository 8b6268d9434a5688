"""A GGUF's quantized blocks kept as they are (`engine.model.blocks`, the C kernels).

The oracle is gguf's numpy dequantizer: decoding must give its float32 values bit for bit
(random blocks, every float16 scale including subnormals, infinities and NaN), and multiplying
must equal `x @ dequantized.T` up to the order of the sums, for every row count the kernel
specialises (1 to 8 per pass, then passes) and each of its paths: AVX-512 (where the CPU has
it), AVX2 and the portable one that any other CPU runs.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from engine.model import ModelConfig, blocks, init_from_seed, kernels, narrow
from engine.model.gguf import GGUFFile, packaged_file
from engine.model.gguf.weights import GGUFSource

FORMATS = {"Q4_1": GGMLQuantizationType.Q4_1, "Q8_0": GGMLQuantizationType.Q8_0}
PATHS = [False, True]  # portable?


def random_blocks(kind: str, rows: int, cols: int, finite: bool, seed: int = 0) -> np.ndarray:
    """Random bytes, (rows, bytes per row); `finite`: scales drawn from normal values only."""
    rng = np.random.default_rng(seed)
    size = blocks.FORMATS[kind][1]
    data = rng.integers(0, 256, size=(rows, cols // 32, size), dtype=np.uint8)
    if finite:  # small normal float16 scales (and minimums), so products stay finite
        halves = 2 if kind == "Q4_1" else 1
        scales = rng.normal(0, 0.05, size=(rows, cols // 32, halves)).astype(np.float16)
        data[:, :, : 2 * halves] = scales.view(np.uint8).reshape(rows, cols // 32, 2 * halves)
    return data.reshape(rows, -1)


def reference(kind: str, data: np.ndarray) -> torch.Tensor:
    with np.errstate(invalid="ignore", over="ignore"):  # inf * 0 in the NaN-scale blocks
        return torch.from_numpy(dequantize(data, FORMATS[kind]).astype(np.float32))


def assert_sums_close(out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> None:
    """Equal up to the order of the sums: float32 rounding of the sum of |terms|."""
    bound = float((x.abs() @ weight.abs().T).max()) * 1e-6
    torch.testing.assert_close(out, x @ weight.T, rtol=0, atol=bound)


@pytest.mark.parametrize("kind", list(FORMATS))
@pytest.mark.parametrize("portable", PATHS)
def test_decoding_gives_gguf_values_bit_for_bit(kind: str, portable: bool) -> None:
    """Every bit pattern of the float16 scale occurs (65,536 blocks of random bytes)."""
    data = random_blocks(kind, rows=2048, cols=1024, finite=False)
    got = blocks.dequantize(torch.from_numpy(data), 1024, portable=portable)
    expected = reference(kind, data)
    assert torch.equal(got.isnan(), expected.isnan())
    assert expected.isnan().any() and expected.isinf().any()  # the edge cases did occur
    inf = float("inf")
    assert torch.equal(got.nan_to_num(0.0, inf, -inf), expected.nan_to_num(0.0, inf, -inf))


@pytest.mark.parametrize("kind", list(FORMATS))
def test_decoding_picks_rows(kind: str) -> None:
    """The embedding's lookup: only the asked rows, in the asked order, repeats allowed."""
    data = torch.from_numpy(random_blocks(kind, rows=50, cols=64, finite=True))
    ids = torch.tensor([49, 0, 7, 7])
    torch.testing.assert_close(
        blocks.dequantize(data, 64, ids), reference(kind, data.numpy())[ids], rtol=0, atol=0
    )
    with pytest.raises(IndexError, match="rows"):
        blocks.dequantize(data, 64, torch.tensor([50]))


@pytest.mark.parametrize("kind", list(FORMATS))
@pytest.mark.parametrize("path", blocks.PATHS)
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 17])
def test_multiplying_equals_the_decoded_matrix(kind: str, path: str, m: int) -> None:
    data = random_blocks(kind, rows=37, cols=96, finite=True, seed=m)
    x = torch.randn(m, 96, generator=torch.Generator().manual_seed(m))
    out = blocks.matmul(x, torch.from_numpy(data), path=path)
    assert_sums_close(out, x, reference(kind, data))


def test_the_paths_are_the_ones_the_cpu_runs() -> None:
    """`best` is AVX-512 for a batch where the CPU has it (this project's machine has), and
    it then sums in another order than AVX2 (16 lanes, not 8): a path that silently fell
    back would give AVX2's bits."""
    lib = kernels.library()
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    assert lib.ug_wide() == int(bool(lib.ug_accelerated()) and " avx512f" in flags)
    if not lib.ug_wide():
        pytest.skip("this CPU has no AVX-512F")
    data = torch.from_numpy(random_blocks("Q4_1", rows=64, cols=1024, finite=True))
    x = torch.randn(4, 1024, generator=torch.Generator().manual_seed(4))
    assert not torch.equal(blocks.matmul(x, data), blocks.matmul(x, data, path="avx2"))
    with pytest.raises(ValueError, match="path"):
        blocks.matmul(x, data, path="gpu")


@pytest.mark.parametrize("m", [1, 8, blocks.FUSED_ROWS + 1, 40])
def test_narrow_linear_takes_either_way_to_the_same_values(m: int) -> None:
    """Up to FUSED_ROWS rows the kernel; beyond, the matrix widened a chunk at a time (here
    smaller than the matrix, so in several parts) for torch's GEMM."""
    data = random_blocks("Q4_1", rows=300, cols=128, finite=True)
    x = torch.randn(m, 128, generator=torch.Generator().manual_seed(m))
    weight = torch.from_numpy(data)
    chunk = narrow.CHUNK_ELEMENTS
    narrow.CHUNK_ELEMENTS = 128 * 64
    try:
        out = narrow.linear(x, weight)
    finally:
        narrow.CHUNK_ELEMENTS = chunk
    assert_sums_close(out, x, reference("Q4_1", data))


def test_a_row_of_the_packaged_file_decodes_as_gguf_does() -> None:
    """The real Q4_1 and Q8_0 tensors of the model `make run` serves."""
    file = GGUFFile(packaged_file("smollm2"))
    for name in ("blk.0.ffn_up.weight", "token_embd.weight"):
        tensor = file.tensors[name]
        data = np.array(tensor.data[:64])
        got = blocks.dequantize(torch.from_numpy(data), int(tensor.shape[0]))
        assert torch.equal(got, reference(tensor.tensor_type.name, data)), name


def test_bad_shapes_name_the_problem() -> None:
    with pytest.raises(ValueError, match="whole blocks of 32"):
        blocks.code(torch.zeros(4, 20, dtype=torch.uint8), 40)
    with pytest.raises(ValueError, match="no known block format"):
        blocks.code(torch.zeros(4, 18, dtype=torch.uint8), 32)  # Q4_0's size
    with pytest.raises(TypeError, match="float32"):
        blocks.matmul(
            torch.zeros(1, 32, dtype=torch.float64), torch.zeros(2, 20, dtype=blocks.BLOCKS)
        )


def test_a_shard_off_the_block_boundaries_is_refused() -> None:
    source = GGUFSource(GGUFFile(packaged_file("smollm2")), head_dim=64)
    part = source.blocks("model.layers.0.mlp.down_proj.weight", cols=slice(768, 1536))
    assert part.dtype == blocks.BLOCKS and part.shape == (576, 768 // 32 * 20)
    with pytest.raises(ValueError, match="do not fall on its 32-value blocks"):
        source.blocks("model.layers.0.mlp.down_proj.weight", cols=slice(0, 40))
    with pytest.raises(ValueError, match="F32"):
        source.blocks("model.norm.weight")


def test_blocks_need_a_gguf_model() -> None:
    with pytest.raises(ValueError, match="do not come from a GGUF file"):
        init_from_seed(ModelConfig.tiny(), seed=0, weight_dtype=blocks.BLOCKS)


def test_blocks_need_float32_arithmetic() -> None:
    with pytest.raises(ValueError, match="float32 activations"):
        init_from_seed(ModelConfig.tiny(), seed=0, dtype=torch.bfloat16, weight_dtype=blocks.BLOCKS)


# -- building the kernels --


def test_the_kernels_build_once_per_source_into_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("UNITGATE_KERNEL_CACHE", str(tmp_path))
    first = kernels.build()
    assert first.parent == tmp_path and first.exists()
    stamp = first.stat().st_mtime_ns
    assert kernels.build() == first and first.stat().st_mtime_ns == stamp  # reused
    assert [p.name for p in tmp_path.iterdir()] == [first.name]  # no partial file left


def test_a_missing_or_failing_compiler_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("UNITGATE_KERNEL_CACHE", str(tmp_path))
    monkeypatch.setenv("CC", "no-such-compiler")
    with pytest.raises(kernels.KernelUnavailable, match="CC='no-such-compiler' is not found"):
        kernels.build()
    monkeypatch.setenv("CC", "false")  # found, and fails
    with pytest.raises(kernels.KernelUnavailable, match="failed"):
        kernels.build()
    assert not os.listdir(tmp_path)
