"""The benchmark's sequence: for each pressure one workload, sized from the prompts' own token
ids; then every mode in turn, each from empty caches, sent the same requests in the same order."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gateway.kvevents.prompts import PromptTokens
from loadtest.bench.prefix import load, pressure
from loadtest.bench.prefix.fleet import Fleet
from loadtest.bench.prefix.report import Result
from loadtest.bench.prefix.routes import EVENTS, Route, kv_figures, wait_index_empty
from loadtest.bench.prefix.scrape import kv_deltas
from loadtest.bench.prefix.workload import Workload, build
from loadtest.bench.stock_vllm import SERVED

SETTLE_S = 1.0  # after a mode's last answer: vLLM's counters and the KV events catch up


@dataclass(frozen=True)
class Settings:
    prefix_words: int
    rounds: int
    concurrency: int
    max_tokens: int
    seed: int


@dataclass(frozen=True)
class Planned:
    workload: Workload
    pressure: pressure.Pressure
    ceiling: float
    prompt_tokens: tuple[int, ...]


def plan(
    target: float,
    settings: Settings,
    tokens: PromptTokens,
    server_blocks: int,
    servers: int,
    block_size: int,
) -> Planned:
    """A workload whose groups' shared blocks fill about `target` of the fleet's blocks: the
    group count from a sample's smallest group, the working set measured on the result."""
    sample = build(4, settings.prefix_words, 2, settings.seed)
    per_group = min(t // block_size for t in _shared(sample, _ids(sample, tokens)))
    groups = pressure.groups_for(target, server_blocks * servers, per_group)
    work = build(groups, settings.prefix_words, settings.rounds, settings.seed)
    ids = _ids(work, tokens)
    cached = [t // block_size * block_size for t in _shared(work, ids)]  # whole blocks only
    lengths = tuple(len(i) for i in ids)
    sized = pressure.Pressure(target, groups, sum(cached) // block_size, server_blocks, servers)
    ceiling = pressure.hit_ceiling(lengths, [r.group for r in work.requests], cached)
    return Planned(work, sized, ceiling, lengths)


def _ids(work: Workload, tokens: PromptTokens) -> list[Sequence[int]]:
    found: list[Sequence[int]] = []
    for request in work.requests:
        ids = tokens.chat(work.messages(request))
        if ids is None:
            raise RuntimeError("the gateway's tokenizer cannot compute the prompts' ids")
        found.append(ids)
    return found


def _shared(work: Workload, ids: Sequence[Sequence[int]]) -> list[int]:
    """Each group's shared tokens: what all its requests' prompts begin with."""
    groups = len(work.prefixes)
    members: list[list[Sequence[int]]] = [[] for _ in range(groups)]
    for request, prompt in zip(work.requests, ids, strict=True):
        members[request.group].append(prompt)
    return [pressure.shared_tokens(m) for m in members]


def measure(
    planned: Planned,
    mode: str,
    routes: Mapping[str, Route],
    fleet: Fleet,
    settings: Settings,
) -> Result:
    """One mode from empty caches (the indexes of the gateways reading events emptied with
    them)."""
    fleet.reset()
    for reading in EVENTS:
        if reading in routes:
            wait_index_empty(routes[reading])
    route = routes[mode]
    kv_before = kv_figures(route) if route.metrics else None
    before = fleet.caches()
    bodies = planned.workload.bodies(SERVED, settings.max_tokens)
    phase = asyncio.run(load.phase(route.url, bodies, settings.concurrency))
    time.sleep(SETTLE_S)
    after = fleet.caches()
    kv = None
    if kv_before is not None and mode in EVENTS:
        kv = kv_deltas(kv_before, kv_figures(route))
    caches = {url: after[url] - before[url] for url in after}
    return Result(planned.pressure, planned.ceiling, mode, phase, caches, kv)
