"""The KV index: blocks stored by units, found by a prompt's own block keys, chained across
events by the engines' hashes; removed, dropped and evicted without leaving anything behind."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.kvevents.index import KvIndex
from gateway.kvevents.keys import ROOT, block_keys, chain
from gateway.kvevents.wire import Removed, Stored

PROMPT = tuple(range(100, 116))  # 4 blocks of 4


def stored(hashes: list[int], tokens: tuple[int, ...], parent: int | None = None) -> Stored:
    return Stored(tuple(hashes), parent, tokens, 4)


def test_keys_chain_like_prefixes() -> None:
    keys = block_keys(PROMPT, 4)
    assert len(keys) == 4 and len(set(keys)) == 4
    assert block_keys(PROMPT[:11], 4) == keys[:2]  # a partial block has no key
    assert block_keys((*PROMPT[:8], 0, 0, 0, 0), 4)[:2] == keys[:2]
    assert block_keys((0, *PROMPT[1:]), 4)[1:] != keys[1:]  # every key depends on all before
    assert chain(ROOT, PROMPT[:4]) == keys[0] != chain(ROOT, PROMPT[:4], extra=True)


def test_a_prompt_finds_the_units_holding_its_prefix() -> None:
    index = KvIndex(100)
    index.stored("a", stored([1, 2], PROMPT[:8]))
    index.stored("a", stored([3], PROMPT[8:12], parent=2))  # chained by the engine's hash
    index.stored("b", stored([9], PROMPT[:4]))
    assert index.match(block_keys(PROMPT, 4)) == {"a": 3, "b": 1}
    assert index.match(block_keys((7, *PROMPT[1:]), 4)) == {}
    assert index.block_size("a") == 4 and index.blocks("a") == 3


def test_a_block_whose_parent_is_unknown_is_skipped_and_counted() -> None:
    index = KvIndex(100)
    assert index.stored("a", stored([3], PROMPT[8:12], parent=2)) == 0
    assert index.orphans == 1 and len(index) == 0


def test_removed_and_dropped_blocks_leave_nothing_behind() -> None:
    index = KvIndex(100)
    index.stored("a", stored([1, 2], PROMPT[:8]))
    index.stored("b", stored([5, 6], PROMPT[:8]))
    index.removed("a", Removed((2,)))
    assert index.match(block_keys(PROMPT, 4)) == {"a": 1, "b": 2}
    index.drop("b")
    assert index.match(block_keys(PROMPT, 4)) == {"a": 1}
    assert index.block_size("b") is None and index.blocks("b") == 0
    index.removed("a", Removed((1, 404)))  # an unknown hash is nothing to remove
    assert len(index) == 0 and index.blocks("a") == 0


def test_memory_is_bounded_least_recent_first() -> None:
    index = KvIndex(3)
    index.stored("a", stored([1, 2], PROMPT[:8]))
    index.match(block_keys(PROMPT[:4], 4))  # the first block is used again
    index.stored("a", stored([3, 4], PROMPT[8:16], parent=2))
    assert len(index) == 3
    keys = block_keys(PROMPT, 4)
    assert index.match(keys[:1]) == {"a": 1}  # kept: matched recently
    assert index.match(keys[1:2]) == {}  # the second block went first
    assert index.blocks("a") == 3


def test_other_cache_groups_are_not_indexed() -> None:
    index = KvIndex(10)
    assert index.stored("a", Stored((1,), None, PROMPT[:4], 4, group=1)) == 0
    index.removed("a", Removed((1,), group=1))
    assert len(index) == 0


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError, match="capacity"):
        KvIndex(0)


@given(st.lists(st.tuples(st.sampled_from("abc"), st.integers(1, 4), st.booleans()), max_size=40))
def test_the_index_agrees_with_a_plain_model(steps: list[tuple[str, int, bool]]) -> None:
    """Units store or remove prefixes of one prompt; the index says what a set per unit says."""
    index = KvIndex(1000)
    held: dict[str, set[int]] = {}  # unit -> blocks (by position) it holds
    for unit, blocks, store in steps:
        hashes = [hash((unit, i)) & 0xFFFF for i in range(blocks)]
        if store:
            index.stored(unit, Stored(tuple(hashes), None, PROMPT[: 4 * blocks], 4))
            held.setdefault(unit, set()).update(range(blocks))
        else:
            index.removed(unit, Removed((hashes[-1],)))
            held.get(unit, set()).discard(blocks - 1)
    expected = {}
    for unit, blocks in held.items():
        depth = 0
        while depth in blocks:
            depth += 1
        if depth:
            expected[unit] = depth
    assert index.match(block_keys(PROMPT, 4)) == expected
