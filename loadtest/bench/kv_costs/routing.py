"""Sections 3b and 3c: what precise routing costs a request once its prompt ids are known.

3b, the cache lookup: `KvFleet.depths` as the dispatcher calls it (the prompt's block keys,
then `KvIndex.match`), on a fleet whose units' entries are all trusted. Worst case for the
match, every unit holds the whole prompt (each block's holders are intersected with those of
the block before); beside it, one unit of 32 holds it (the others hold other blocks). The
keys alone are timed too: they are most of it.

3c, the latency model: `Forecast.estimates` over the candidates (each unit learned), and one
request's learning, `Placed` then `sent`, `first_token` and `finished` on one unit: with
`learn_every = 0` each request makes both least-squares updates; with the default (0.5 s) a
unit answering 100 requests a second learns from one in fifty, once learned.
"""

from __future__ import annotations

import random
from array import array
from collections.abc import Sequence
from functools import partial
from typing import Any

from gateway.kvevents.fleet import KvFleet
from gateway.kvevents.keys import block_keys
from gateway.kvevents.wire import Stored
from gateway.routing.forecast import Forecast, Placed
from loadtest.bench.kv_costs.timing import cpu_us

UNITS = (2, 8, 32)
PROMPTS = (500, 2000, 8000)
BLOCK_SIZES = (16, 128)
ESTIMATE_PROMPT = 2000
RATE_PER_UNIT = 100.0  # requests a second one unit answers, for the default learn_every


class TrustedFleet(KvFleet):
    """Every unit's entries trusted, with no subscriber: the index is filled directly."""

    def trusted(self, unit: str) -> bool:
        return True


def _fleet(prompt: array[int], size: int, units: int, holders: int, rng: random.Random) -> KvFleet:
    fleet = TrustedFleet(1_000_000)
    blocks = len(prompt) // size
    for u in range(units):
        tokens = tuple(prompt[: blocks * size]) if u < holders else tuple(range(size))
        hashes = tuple(rng.getrandbits(64) for _ in range(len(tokens) // size))
        fleet.index.stored(f"u{u}", Stored(hashes, None, tokens, size))
    return fleet


def depths(
    sizes: Sequence[int], prompts: Sequence[int], units: Sequence[int], seed: int, budget_s: float
) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    rows = []
    for size in sizes:
        for length in prompts:
            prompt = array("i", (rng.randrange(49_152) for _ in range(length)))
            row: dict[str, Any] = {"block_size": size, "prompt_tokens": length}
            row["blocks"] = len(prompt) // size
            row["keys_us"] = cpu_us(partial(block_keys, prompt, size), budget_s)
            most = max(units)
            one = _fleet(prompt, size, most, 1, rng)
            names = [f"u{u}" for u in range(most)]
            assert one.depths(prompt, names)["u0"] > 0
            row[f"one_of_{most}_us"] = cpu_us(partial(one.depths, prompt, names), budget_s)
            for n in units:
                every = _fleet(prompt, size, n, n, rng)
                some = [f"u{u}" for u in range(n)]
                row[f"all_{n}_us"] = cpu_us(partial(every.depths, prompt, some), budget_s)
            rows.append(row)
    return rows


def learned(units: Sequence[str], learn_every: float) -> Forecast:
    """A forecast that has learned each unit, from answers of varied prompts and loads."""
    forecast = Forecast(learn_every=0.0)
    now = 0.0
    for i in range(2 * forecast.least):
        for unit in units:
            placed = Placed(unit, 500 + (i * 397) % 4000, (i * 131) % 500, None)
            forecast.sent(placed, i % 8, now)
            forecast.first_token(placed, now + 0.02 + placed.uncached / 1e5 + 0.005 * (i % 8))
            forecast.finished(placed, 0.02 + 0.001 * (i % 8), now + 1.0)
            now += 1.0  # answers in order: each is due to be learned
    forecast.learn_every = learn_every
    return forecast


def estimates(units: Sequence[int], budget_s: float) -> list[dict[str, Any]]:
    rows = []
    for n in units:
        names = [f"u{u}" for u in range(n)]
        forecast = learned(names, Forecast().learn_every)
        candidates = [(name, u % 8) for u, name in enumerate(names)]
        cached = {name: 1024 for name in names[::2]}
        assert forecast.estimates(candidates, ESTIMATE_PROMPT, cached) is not None
        us = cpu_us(partial(forecast.estimates, candidates, ESTIMATE_PROMPT, cached), budget_s)
        rows.append({"units": n, "estimates_us": us})
    return rows


def learning(budget_s: float) -> list[dict[str, Any]]:
    rows = []
    for every in (0.0, Forecast().learn_every):
        forecast = learned(["u0"], every)
        clock = [1e6]  # after the answers it learned from

        def request(forecast: Forecast = forecast, clock: list[float] = clock) -> None:
            clock[0] += 1.0 / RATE_PER_UNIT
            placed = Placed("u0", ESTIMATE_PROMPT, 512, None)
            forecast.sent(placed, 3, clock[0])
            forecast.first_token(placed, clock[0] + 0.1)
            forecast.finished(placed, 0.02, clock[0] + 0.1)

        rows.append(
            {
                "learn_every": every,
                "requests_per_s_per_unit": RATE_PER_UNIT,
                "us_per_request": cpu_us(request, budget_s),
            }
        )
    return rows
