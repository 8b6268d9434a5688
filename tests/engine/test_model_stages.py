"""Pipeline bookkeeping: which rank is which stage, and the split of layers by cost."""

from __future__ import annotations

import pytest

from engine.model import ModelConfig
from engine.model.stages import Layout, Part, costs, part_of, plan, split


def test_ranks_are_stage_major_with_the_leader_on_stage_0() -> None:
    layouts = [Layout(rank, 4, pp=2) for rank in range(4)]
    assert [(x.stage, x.tp_rank) for x in layouts] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert [x.next for x in layouts] == [2, 3, 0, 0]  # the last stage hands back to rank 0
    assert [x.returns for x in layouts] == [False, False, True, False]  # one sender back
    assert layouts[3].previous == 1 and layouts[0].stage_ranks(1) == [2, 3]


def test_the_split_balances_cost_with_the_ends_on_stage_0() -> None:
    # ends worth 4 layers: 34 layers' worth over 2 stages is 13 + ends against 17
    assert split(30, 2, 1.0, 4.0) == [range(0, 13), range(13, 30)]
    assert split(30, 3, 1.0, 4.0) == [range(0, 7), range(7, 19), range(19, 30)]
    assert split(4, 4, 1.0, 100.0) == [range(i, i + 1) for i in range(4)]  # one layer each
    assert split(6, 2, 1.0, 0.0) == [range(0, 3), range(3, 6)]


def test_a_stage_holds_the_ends_only_where_they_run() -> None:
    ranges = split(30, 2, 1.0, 4.0)
    parts = [part_of(Layout(rank, 4, pp=2), ranges) for rank in range(4)]
    assert parts[0] == Part(0, 13, embed=True, head=True)
    assert parts[1] == Part(0, 13, embed=True, head=False)  # stage 0's other TP rank
    assert parts[2] == parts[3] == Part(13, 30, embed=False, head=False)
    tiny = ModelConfig.tiny()
    assert plan(Layout(0, 2, pp=1))(tiny) == Part.whole(tiny.num_layers)


def test_smollm2s_head_costs_about_four_layers() -> None:
    config = ModelConfig(49152, 576, 30, 9, 3, 1536, tie_embeddings=True)
    layer, ends = costs(config)
    assert ends / layer == pytest.approx(4.0, rel=0.01)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Layout(0, 3, pp=2), "pp: 2 pipeline stages do not divide world_size=3"),
        (lambda: Layout(0, 2, pp=0), "pp: must be >= 1"),
        (lambda: split(2, 3, 1.0, 0.0), "pp: 3 stages cannot split 2 layers"),
    ],
)
def test_shapes_that_cannot_be_are_refused_by_name(make: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()  # type: ignore[operator]
