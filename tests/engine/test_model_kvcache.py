"""The paged KV cache: incremental decoding equals recomputation, slots are isolated, and a
slot reads its positions wherever its block table puts them (shared, scattered, copied).

Every test runs twice: on the C kernels (decode attention, `engine.model.decode_attention`,
and the norms, `engine.model.norm`), and on torch's ways, which a machine without a C compiler
runs."""

from __future__ import annotations

import pytest
import torch

from engine.model import ModelConfig, Transformer, decode_attention, init_from_seed, norm
from engine.model.transformer import Decode

PROMPT = [256, 259, *b"The quick brown fox", 261, 260]
MORE = list(b" jumps")


@pytest.fixture(scope="module")
def config() -> ModelConfig:
    return ModelConfig(
        vocab_size=300,
        hidden_size=64,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=128,
        max_seq_len=64,
    )


@pytest.fixture(autouse=True, params=["kernel", "torch"])
def attention(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Which way the models built in the test attend their decodes and norm."""
    if request.param == "torch":
        monkeypatch.setattr(decode_attention, "available", lambda dtype: False)
        monkeypatch.setattr(norm, "available", lambda dtype: False)
    return str(request.param)


def fresh(config: ModelConfig) -> Transformer:
    return init_from_seed(config, seed=3, num_slots=4)


def test_each_way_is_the_one_the_models_use(config: ModelConfig, attention: str) -> None:
    model = fresh(config)
    assert model.attention_kernel is model.norm_kernel is (attention == "kernel")


def test_prefill_then_decode_equals_full_prefill(config: ModelConfig) -> None:
    model = fresh(config)
    model([(0, PROMPT, 0)])
    steps = [model([(0, [t], len(PROMPT) + i)])[0] for i, t in enumerate(MORE)]
    full = fresh(config)
    for i in range(len(MORE)):
        expected = full([(1, PROMPT + MORE[: i + 1], 0)])[0]
        torch.testing.assert_close(steps[i], expected, atol=1e-5, rtol=0)


def test_chunked_prefill_equals_one_prefill(config: ModelConfig) -> None:
    model = fresh(config)
    model([(2, PROMPT[:7], 0)])
    chunked = model([(2, PROMPT[7:], 7)])
    torch.testing.assert_close(chunked, fresh(config)([(0, PROMPT, 0)]), atol=1e-5, rtol=0)


def test_slots_do_not_interfere(config: ModelConfig) -> None:
    model = fresh(config)
    alone = fresh(config)([(0, PROMPT, 0)])
    model([(3, MORE * 3, 0)])
    torch.testing.assert_close(model([(0, PROMPT, 0)]), alone, atol=1e-5, rtol=0)
    # Rewriting slot 3 leaves slot 0's cache valid for its next decode step.
    model([(3, PROMPT[::-1], 0)])
    decode = model([(0, [42], len(PROMPT))])
    torch.testing.assert_close(decode, fresh(config)([(0, [*PROMPT, 42], 0)]), atol=1e-5, rtol=0)


def test_mixed_prefill_and_decode_in_one_call(config: ModelConfig) -> None:
    model = fresh(config)
    model([(0, PROMPT, 0)])
    mixed = model([(1, MORE, 0), (0, [7], len(PROMPT)), (2, [5], 0)])
    assert mixed.shape == (3, config.vocab_size)
    ref = fresh(config)
    torch.testing.assert_close(mixed[0], ref([(0, MORE, 0)])[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(mixed[1], ref([(1, [*PROMPT, 7], 0)])[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(mixed[2], ref([(2, [5], 0)])[0], atol=1e-5, rtol=0)


def test_a_decode_batch_attends_in_one_call_as_each_entry_alone(config: ModelConfig) -> None:
    """All-single-token batches take one masked attention over the gathered slots: each
    entry must see exactly its own positions (not the longest's), as if decoded alone."""
    model, ref = fresh(config), fresh(config)
    prompts = {0: PROMPT, 2: MORE, 3: PROMPT[:3]}  # different lengths; slot 1 stays unused
    for slot, ids in prompts.items():
        model([(slot, ids, 0)])
        ref([(slot, ids, 0)])
    batch = [(slot, [40 + slot], len(ids)) for slot, ids in prompts.items()]
    together = model(batch)
    alone = torch.cat([ref([entry]) for entry in batch])
    torch.testing.assert_close(together, alone, atol=1e-5, rtol=0)
    # The batch wrote each entry's key and value at its own position: the next step agrees too.
    step = [(slot, [7], start + 1) for slot, _, start in batch]
    torch.testing.assert_close(
        model(step), torch.cat([ref([entry]) for entry in step]), atol=1e-5, rtol=0
    )


def test_decodes_then_a_prompt_chunk_in_one_call_as_each_alone(config: ModelConfig) -> None:
    """A chunked-prefill step: the leading single-token entries are attended together, the
    chunk after them (continuing its slot's prompt) on its own; each as if it ran alone."""
    model, ref = fresh(config), fresh(config)
    for m in (model, ref):
        for slot, ids in ((0, PROMPT), (2, MORE), (3, PROMPT[:7])):
            m([(slot, ids, 0)])
    batch = [(0, [40], len(PROMPT)), (2, [41], len(MORE)), (3, PROMPT[7:12], 7)]
    positions = torch.tensor([len(PROMPT), len(MORE), *range(7, 12)])
    plan = Decode.plan(batch, positions, model.cache, model.attention_kernel)
    assert plan is not None and plan.num_entries == 2
    together = model(batch)
    torch.testing.assert_close(together, torch.cat([ref([e]) for e in batch]), atol=1e-5, rtol=0)
    rest = model([(3, PROMPT[12:], 12)])  # the chunk's keys and values went to their places
    torch.testing.assert_close(rest, fresh(config)([(0, PROMPT, 0)]), atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    ("batch", "field"),
    [
        ([], "batch"),
        ([(4, [1], 0)], "slot"),
        ([(0, [1], 64)], "start_pos"),
        ([(0, [], 0)], "token_ids"),
        ([(0, [300], 0)], "token_ids"),
        ([(0, [1], 0), (0, [2], 1)], "batch"),
    ],
)
def test_bad_entries_are_rejected(
    config: ModelConfig, batch: list[tuple[int, list[int], int]], field: str
) -> None:
    with pytest.raises(ValueError, match=field):
        fresh(config)(batch)


def test_a_child_sharing_full_blocks_and_a_copied_partial_block_decodes_as_its_source(
    config: ModelConfig,
) -> None:
    """A request's other choice: its table names the parent's full blocks and a copy of the
    parent's partial last block; it decodes as if it had prefilled the prompt, whatever its
    own blocks held before (positions past the copy are never attended)."""
    model = fresh(config)
    model([(2, MORE * 3, 0)])  # stale keys and values in the child's own blocks
    model([(0, PROMPT, 0)])
    parent = model.cache.table(0)
    child = model.cache.table(2)
    full, partial = divmod(len(PROMPT), model.cache.block_size)
    assert (full, partial) == (1, 7)
    model.cache.set_tables([(2, 0, parent[:full])])
    model.cache.copy_blocks([(parent[full], child[full], partial)])
    decode = model([(2, [42], len(PROMPT)), (0, [43], len(PROMPT))])
    ref = fresh(config)
    torch.testing.assert_close(decode[0], ref([(0, [*PROMPT, 42], 0)])[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(decode[1], ref([(1, [*PROMPT, 43], 0)])[0], atol=1e-5, rtol=0)


def test_scattered_blocks_read_as_contiguous_ones(config: ModelConfig) -> None:
    """Blocks out of order (gathered reads, prefill and decode) give the contiguous answer."""
    model, ref = fresh(config), fresh(config)
    model.cache.set_tables([(1, 0, (13, 2, 7, 9)), (3, 0, (5, 0, 11, 4))])
    assert model.cache.table(1) == (13, 2, 7, 9)
    long = PROMPT + MORE * 2  # 35 positions: three blocks
    torch.testing.assert_close(model([(1, long, 0)]), ref([(1, long, 0)]), atol=1e-5, rtol=0)
    model([(3, PROMPT[:20], 0)])
    ref([(3, PROMPT[:20], 0)])
    chunk = [(3, PROMPT[20:], 20)]  # continues across a block boundary, gathered
    torch.testing.assert_close(model(chunk), ref(chunk), atol=1e-5, rtol=0)
    step = [(1, [5], len(long)), (3, [6], len(PROMPT))]
    torch.testing.assert_close(model(step), ref(step), atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    ("copy", "field"),
    [
        ((16, 1, 3), "src"),
        ((0, -1, 3), "dst"),
        ((1, 1, 3), "dst"),
        ((0, 1, 0), "length"),
        ((0, 1, 17), "length"),
    ],
)
def test_bad_block_copies_are_rejected(
    config: ModelConfig, copy: tuple[int, int, int], field: str
) -> None:
    model = fresh(config)
    model([(0, PROMPT, 0)])
    before = model.cache.k.clone()
    with pytest.raises(ValueError, match=field):
        model.cache.copy_blocks([(0, 2, 3), copy])  # the good first copy is not made either
    assert torch.equal(model.cache.k, before)


@pytest.mark.parametrize(
    ("edit", "field"),
    [((4, 0, (1,)), "slot"), ((0, 3, (1, 2)), "table"), ((0, 0, (16,)), "block")],
)
def test_bad_table_edits_are_rejected(
    config: ModelConfig, edit: tuple[int, int, tuple[int, ...]], field: str
) -> None:
    model = fresh(config)
    with pytest.raises(ValueError, match=field):
        model.cache.set_tables([(1, 0, (9,)), edit])
    assert model.cache.table(1) == (4, 5, 6, 7)  # the good first edit was not applied


def test_fewer_blocks_than_the_slots_need_are_refused(config: ModelConfig) -> None:
    with pytest.raises(ValueError, match="num_blocks: 15"):
        Transformer(config, num_slots=4, num_blocks=15)
    assert Transformer(config, num_slots=4, num_blocks=40).cache.num_blocks == 40
