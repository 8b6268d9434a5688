"""The hedging benchmarks' gateway configs are ones the gateway accepts, with the hedging each
row names (a renamed key would otherwise surface only in a long benchmark run)."""

from __future__ import annotations

import tomllib
from pathlib import Path

from gateway.config import config_from_dict
from loadtest.bench import hedge_cost, tied
from loadtest.bench.stock_vllm import Server

URLS = ["http://127.0.0.1:1", "http://127.0.0.1:2"]


def test_the_tied_benchmarks_gateways_hedge_as_their_rows_say() -> None:
    seen = {}
    for mode, hedge in tied.MODES.items():
        config = config_from_dict(tomllib.loads(tied.gateway_config(URLS, hedge)))
        h = config.hedge
        seen[mode] = (h.enabled, h.tie, h.max_delay, h.budget_share)
        assert [u.weight for u in config.units] == [1.0, 0.5]  # u0 is the first pick
        assert not config.routing.engine_load
    assert seen == {
        "off": (False, True, 2.0, 0.05),
        "delayed": (True, False, 2.0, 0.05),
        "delayed 0.5 s": (True, False, 0.5, 1.0),
        "tied": (True, True, 2.0, 0.05),
    }


def test_the_hedge_cost_benchmarks_gateways_hedge_every_request_or_none() -> None:
    servers = [Server(None, Path("log"), url) for url in URLS]  # type: ignore[arg-type]
    off = config_from_dict(tomllib.loads(hedge_cost.gateway_toml(servers, None)))
    on = config_from_dict(tomllib.loads(hedge_cost.gateway_toml(servers, 0.2)))
    assert not off.hedge.enabled
    assert (on.hedge.enabled, on.hedge.min_delay, on.hedge.max_delay) == (True, 0.2, 0.2)
    assert on.hedge.budget_share == 1.0
    assert [u.kind for u in on.units] == ["vllm", "vllm"]
