"""Tensor parallelism in real Gloo process groups: TP=1, 2 and 4 compute the same function."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from engine.model import ByteTokenizer, ModelConfig, TPContext, init_from_seed, load_hf_folder
from gateway.base.ports import free_port

Worker = Callable[..., dict[str, Any]]


def _entry(rank: int, world: int, port: int, fn: Worker, args: tuple[Any, ...], out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=60),
    )
    try:
        result = fn(TPContext.from_process_group(), *args)
        torch.save(result, os.path.join(out, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def run_group(world: int, fn: Worker, args: tuple[Any, ...], tmp: Path) -> list[dict[str, Any]]:
    """Run fn(tp, *args) on `world` spawned ranks; return each rank's result."""
    ctx = mp.spawn(_entry, (world, free_port(), fn, args, str(tmp)), nprocs=world, join=False)
    deadline = time.monotonic() + 90
    while not ctx.join(timeout=0.1):
        if time.monotonic() > deadline:
            for proc in ctx.processes:
                proc.kill()
            pytest.fail(f"world size {world}: ranks did not finish within 90 s")
    return [torch.load(tmp / f"rank{r}.pt") for r in range(world)]


def greedy_seed(tp: TPContext, steps: int = 16) -> dict[str, Any]:
    """Greedy decoding of the tiny seeded model; slot 1 to show slots are independent."""
    model = init_from_seed(ModelConfig.tiny(), seed=0, tp=tp, num_slots=2)
    prompt = ByteTokenizer().apply_chat_template([{"role": "user", "content": "hello, tp!"}])
    logits = model([(1, prompt, 0)])
    history, ids = [logits], []
    for pos in range(len(prompt), len(prompt) + steps):
        ids.append(int(logits[0].argmax()))
        logits = model([(1, [ids[-1]], pos)])
        history.append(logits)
    return {"ids": ids, "logits": torch.cat(history)}


def hf_logits(tp: TPContext, folder: str, prompt: list[int], decode: list[int]) -> dict[str, Any]:
    """Prefill `prompt`, then decode `decode` one token at a time; all last-token logits."""
    model = load_hf_folder(folder, tp=tp, num_slots=1)
    history = [model([(0, prompt, 0)])]
    for i, token in enumerate(decode):
        history.append(model([(0, [token], len(prompt) + i)]))
    return {"logits": torch.cat(history)}


def greedy_world_and_pair(tp: TPContext) -> dict[str, Any]:
    """One launch of 4 ranks serves two world sizes: all 4 ranks, then ranks 0-1 as an
    explicit subgroup (also covers a non-default process group)."""
    result = {"tp4": greedy_seed(tp)}
    pair = dist.new_group([0, 1])
    if tp.rank < 2:
        result["tp2"] = greedy_seed(TPContext(rank=tp.rank, world_size=2, group=pair))
    return result


@pytest.mark.slow
def test_greedy_tokens_identical_across_world_sizes(tmp_path: Path) -> None:
    expected = greedy_seed(TPContext())
    assert len(set(expected["ids"])) > 1, "degenerate output would hide TP bugs"
    results = run_group(4, greedy_world_and_pair, (), tmp_path)
    for rank, result in enumerate(results):
        for key in ("tp4", "tp2") if rank < 2 else ("tp4",):
            assert result[key]["ids"] == expected["ids"], f"{key} rank {rank}"
            torch.testing.assert_close(result[key]["logits"], expected["logits"], atol=1e-4, rtol=0)
