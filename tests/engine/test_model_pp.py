"""Pipeline parallelism in real Gloo process groups: pp 2 and 3, and tp 2 x pp 2, compute the
same function as one rank, with the step messages sent as a pipelined unit sends them."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.model import ByteTokenizer, ModelConfig, TPContext, init_from_seed
from engine.model.pipeline import PipelineStage
from engine.model.stages import Layout, plan
from engine.runtime.group import stage_group
from engine.runtime.messages import Command, StepMessage
from engine.runtime.unicast import Unicast, UnicastReceiver
from tests.engine.test_model_tp import run_group

STEPS = 12
SEED = 1  # seeds 0 and 2 decode a token over and over for one of the prompts
PROMPTS = ("hello, pp!", "a second, longer prompt for slot 2")


def greedy(model: Any, send: Any = None) -> dict[str, Any]:
    """Two sequences prefilled apart, then decoded together (a batch of two, attended in one
    call); every step's message goes out first when `send` is given (the leader)."""
    tokenizer = ByteTokenizer()
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": p}]) for p in PROMPTS]
    history: list[torch.Tensor] = []
    ids: list[list[int]] = [[], []]

    def step(batch: list[tuple[int, list[int], int]]) -> torch.Tensor:
        if send is not None:
            send(StepMessage.step(batch, 0, 0))
        logits: torch.Tensor = model(batch)
        history.append(logits)
        return logits

    last = [step([(slot + 1, prompt, 0)])[0] for slot, prompt in enumerate(prompts)]
    positions = [len(p) for p in prompts]
    for _ in range(STEPS):
        for row in (0, 1):
            ids[row].append(int(last[row].argmax()))
        batch = [(row + 1, [ids[row][-1]], positions[row]) for row in (0, 1)]
        logits = step(batch)
        last = [logits[0], logits[1]]
        positions = [p + 1 for p in positions]
    return {"ids": ids, "logits": torch.cat(history)}


def pipelined(world: TPContext, pp: int) -> dict[str, Any]:
    """This rank's stage of the tiny model; rank 0 drives the steps as a leader would."""
    layout = Layout(world.rank, world.world_size, pp)
    config = ModelConfig.tiny()
    shard = TPContext(rank=layout.tp_rank, world_size=layout.tp)
    model = init_from_seed(config, seed=SEED, tp=shard, num_slots=3, part=plan(layout)(config))
    model.use_group(stage_group(layout))
    stage = PipelineStage(model, layout)
    result: dict[str, Any] = {"layers": [layout.stage, model.part.first, model.part.last]}
    if layout.rank == 0:
        send = Unicast(layout.world_size, stage.sender)
        result |= greedy(stage, send)
        send(StepMessage(Command.STOP))
    else:
        receive = UnicastReceiver()
        while (msg := receive()).command is not Command.STOP:
            stage(msg.entries)
    stage.sender.drain()
    return result


@pytest.mark.slow
@pytest.mark.parametrize(("world", "pp"), [(2, 2), (3, 3), (4, 2)], ids=["pp2", "pp3", "tp2xpp2"])
def test_greedy_tokens_identical_to_one_rank(world: int, pp: int, tmp_path: Path) -> None:
    expected = greedy(init_from_seed(ModelConfig.tiny(), seed=SEED, num_slots=3))
    assert all(len(set(row)) > 1 for row in expected["ids"]), "degenerate output hides bugs"
    results = run_group(world, pipelined, (pp,), tmp_path)
    assert results[0]["ids"] == expected["ids"]
    torch.testing.assert_close(results[0]["logits"], expected["logits"], atol=1e-4, rtol=0)
    held = sorted({tuple(r["layers"]) for r in results})
    assert [s for s, _, _ in held] == list(range(pp)), held  # every stage held, in order
    assert held[0][1] == 0 and held[-1][2] == ModelConfig.tiny().num_layers
    assert all(a[2] == b[1] for a, b in itertools.pairwise(held)), held
