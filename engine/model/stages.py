"""Pipeline parallelism's bookkeeping: which rank is which stage, and which layers each holds.

A unit of `tp x pp` nodes is `pp` stages of `tp` ranks each, stage-major: ranks
`s * tp .. s * tp + tp - 1` are stage `s`, so rank 0 (the leader) is stage 0. Within a stage
the ranks split every layer as tensor parallelism does (`engine.model.parallel`); across
stages each holds a contiguous range of layers and hands its activations to the next.

Stage 0 holds the embedding and also the final norm and the LM head: the last stage sends
back only the hidden state of each entry's last token (hidden floats per entry, 576 for
SmolLM2, against a vocab of 49,152 logits), and the leader samples as it does without a
pipeline. Only rank 0 computes the head; the other ranks of stage 0 hold the embedding.

The split balances measured cost: `split` takes the cost of one layer and of the two ends
(the embedding lookup and the head) and gives each stage a contiguous range whose total,
with the ends counted on stage 0, is as even as whole layers allow. `costs` prices them
from the model's shape with factors measured on this project's machine (below); every rank
computes the same split from the same config, so no rank has to tell another. Pure: no torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from engine.model.config import ModelConfig

# A decode step's cost of the head per value of its matrix (vocab x hidden), relative to a
# layer's per value of its seven matrices. Measured for SmolLM2 with the file's blocks, one
# thread, batch 1, 4 and 8 (2026-12-08, decode attention by its kernel): a layer 0.52 / 0.92
# / 1.23 ms, the head (norm, LM head) 2.09 / 3.37 / 6.74 ms, for 8.0 times a layer's values:
# 0.50 / 0.46 / 0.68 a value (4 rows is a PP 2 micro-batch at 8 streams). The head's Q8_0
# blocks decode faster per value than the layers' Q4_1, and a layer also runs attention and a
# dozen small ops; with float weights the two are closer to 1, which moves a split by a layer
# at most.
HEAD_VALUE_COST = 0.5


@dataclass(frozen=True, slots=True)
class Part:
    """What one rank holds of the model: layers [first, last), and whether the embedding
    and the head (final norm and LM head) are among them."""

    first: int
    last: int
    embed: bool = True
    head: bool = True

    def __post_init__(self) -> None:
        if not 0 <= self.first < self.last:
            raise ValueError(f"part: layers {self.first}..{self.last} hold no layer")
        if self.head and not self.embed:  # a tied head is the embedding's own tensor
            raise ValueError("part: the head is held with the embedding (on stage 0)")

    @classmethod
    def whole(cls, num_layers: int) -> Part:
        return cls(0, num_layers)

    @property
    def layers(self) -> range:
        return range(self.first, self.last)


@dataclass(frozen=True, slots=True)
class Layout:
    """This rank's place in a `tp x pp` unit (see the module docstring for the order)."""

    rank: int
    world_size: int
    pp: int = 1

    def __post_init__(self) -> None:
        if self.pp < 1:
            raise ValueError(f"pp: must be >= 1, got {self.pp}")
        if self.world_size % self.pp:
            raise ValueError(
                f"pp: {self.pp} pipeline stages do not divide world_size={self.world_size}"
            )
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank: {self.rank} is outside [0, {self.world_size})")

    @property
    def tp(self) -> int:
        return self.world_size // self.pp

    @property
    def stage(self) -> int:
        return self.rank // self.tp

    @property
    def tp_rank(self) -> int:
        return self.rank % self.tp

    @property
    def is_first(self) -> bool:
        return self.stage == 0

    @property
    def is_last(self) -> bool:
        return self.stage == self.pp - 1

    def stage_ranks(self, stage: int) -> list[int]:
        return list(range(stage * self.tp, (stage + 1) * self.tp))

    @property
    def previous(self) -> int:
        """The rank this one receives activations from (the same place one stage up)."""
        return self.rank - self.tp

    @property
    def next(self) -> int:
        """The rank this one sends activations to; from the last stage, rank 0 (the head)."""
        return 0 if self.is_last else self.rank + self.tp

    @property
    def returns(self) -> bool:
        """Whether this rank sends the last stage's hidden states back to the leader."""
        return self.is_last and self.tp_rank == 0 and self.pp > 1


def split(num_layers: int, pp: int, layer_cost: float, ends_cost: float) -> list[range]:
    """Contiguous layer ranges, one per stage, balancing `ends_cost` (embedding and head, on
    stage 0) plus `layer_cost` per layer. Every stage gets at least one layer."""
    if not 1 <= pp <= num_layers:
        raise ValueError(f"pp: {pp} stages cannot split {num_layers} layers (1..{num_layers})")
    if layer_cost <= 0 or ends_cost < 0:
        raise ValueError(f"costs: layer {layer_cost} must be > 0 and ends {ends_cost} >= 0")
    total = ends_cost + num_layers * layer_cost
    bounds, start = [], 0
    for stage in range(pp - 1):
        target = total * (stage + 1) / pp  # where this stage's share ends, cumulatively
        room = num_layers - (pp - stage - 1)  # leave one layer for each stage after
        end = round((target - ends_cost) / layer_cost)
        end = min(max(end, start + 1), room)
        bounds.append(range(start, end))
        start = end
    bounds.append(range(start, num_layers))
    return bounds


def part_of(layout: Layout, ranges: list[range]) -> Part:
    """The part a rank holds, given the stages' layer ranges."""
    layers = ranges[layout.stage]
    return Part(
        layers.start,
        layers.stop,
        embed=layout.is_first,
        head=layout.is_first and layout.tp_rank == 0,
    )


PartPlan = Callable[[ModelConfig], Part]


def costs(config: ModelConfig) -> tuple[float, float]:
    """(one layer, embedding and head) in a layer's matrix values (see HEAD_VALUE_COST)."""
    c = config
    kv = c.num_kv_heads * c.head_dim
    layer = c.hidden_size * (2 * c.hidden_size + 2 * kv) + 3 * c.hidden_size * c.intermediate_size
    return float(layer), HEAD_VALUE_COST * c.vocab_size * c.hidden_size


def plan(layout: Layout) -> PartPlan:
    """What `layout`'s rank holds of a model, once its config is read."""

    def part(config: ModelConfig) -> Part:
        if layout.pp == 1:
            return Part.whole(config.num_layers)
        return part_of(layout, split(config.num_layers, layout.pp, *costs(config)))

    return part
