"""The five ways to the same servers, each running for the whole benchmark and idle while
another is measured:

- `load`: the gateway with `affinity = "none"` and `prefix_scorer = "off"`, so that nothing
  but load places a request: power of two choices over the units by requests in flight (with
  two units, the less loaded one). The gateway's own load-only routing, where a strict round
  robin would ignore the queue a cold prefill leaves behind.
- `approximate`: the gateway's affinity by default (`session+prefix`, no sessions sent) with
  `prefix_scorer = "approximate"`: the first `prefix_chars` of the prompt, bounded rendezvous
  hashing.
- `vllm-router`: vllm-router's `cache_aware` policy at its defaults (an approximate radix
  tree of the prompts' text per worker, load balancing past its thresholds).
- `precise`: `prefix_scorer = "auto"` with every unit's KV events (`kv_events`,
  `kv_events_replay`) and the model's tokenizer (`[routing] tokenizers`), the latency model
  observing (the default): to the unit holding the most of the prompt.
- `predicted`: the same, with the latency model routing (`latency_model = "route"`): to the
  unit predicted to answer soonest, its cached tokens counted, once each
  unit's speed is learned (20 answers each).

One more on request (`--modes`), not by default:

- `precise-plain`: `precise` with the plain load bound for a cached prompt too
  (`cached_load_factor` = `bounded_load_factor`, 1.25): what the looser bound is worth.

The load-only and approximate modes run with the latency model off.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from loadtest.bench.overhead import peers
from loadtest.bench.prefix import scrape
from loadtest.bench.prefix.fleet import fetch
from loadtest.bench.processes import child
from loadtest.bench.stock_vllm import SERVED, Server

MODES = ("load", "approximate", "vllm-router", "precise", "predicted")
ALL_MODES = (*MODES, "precise-plain")
# [routing] of each gateway mode: (affinity, prefix_scorer, latency_model, cached_load_factor)
ROUTING = {
    "load": ("none", "off", "off", 2.0),
    "approximate": ("session+prefix", "approximate", "off", 2.0),
    # observed, not routed by: routes as with it off, and predicts each request's cached
    # tokens, which the servers' counts check
    "precise": ("session+prefix", "auto", "observe", 2.0),
    "predicted": ("session+prefix", "auto", "route", 2.0),
    "precise-plain": ("session+prefix", "auto", "observe", 1.25),
}
# The modes that read the units' KV events.
EVENTS = tuple(mode for mode, (_, scorer, _, _) in ROUTING.items() if scorer == "auto")
# vLLM engines on two shared cores answer probes late while they prefill: probes get room,
# the stall check waits out a cold prefill, and no breaker ejects a unit for being slow, so
# that what differs between modes is where requests go.
TOML = """\
[gateway]
port = 0
models = ["{model}"]
[metrics]
port = 0
[admin]
enabled = false
[routing]
affinity = "{affinity}"
prefix_scorer = "{scorer}"
latency_model = "{latency}"
cached_load_factor = {cached}
{tokenizers}[health]
interval = 0.5
timeout = 5.0
fall = 3
stall_timeout = 120.0
[breaker]
enabled = false
[timeouts]
first_byte = 300.0
idle = 120.0
"""
TRUST_S = 60.0  # until the precise gateway trusts every unit's events
EMPTY_S = 30.0  # until its index shows a reset's AllBlocksCleared


@dataclass(frozen=True)
class Route:
    url: str
    metrics: str = ""  # the gateway's metrics URL ("" for vllm-router)


def gateway_toml(mode: str, servers: Sequence[Server], tokenizer: Path) -> str:
    affinity, scorer, latency, cached = ROUTING[mode]
    precise = mode in EVENTS
    tokenizers = f'tokenizers = {{ "{SERVED}" = "{tokenizer}" }}\n' if precise else ""
    head = TOML.format(
        model=SERVED,
        affinity=affinity,
        scorer=scorer,
        latency=latency,
        cached=cached,
        tokenizers=tokenizers,
    )
    units = []
    for i, server in enumerate(servers):
        unit = f'[[units]]\nid = "v{i}"\nleader = "{server.url}"\nkind = "vllm"\n'
        unit += f'served_model = "{SERVED}"\n'
        if precise:
            unit += f'kv_events = "{server.kv_events}"\nkv_events_replay = "{server.kv_replay}"\n'
        units.append(unit)
    return head + "".join(units)


@contextlib.contextmanager
def routes(
    tmp: Path, servers: Sequence[Server], modes: Sequence[str], tokenizer: Path
) -> Iterator[dict[str, Route]]:
    """Every mode of `modes` running, by name; stopped on exit."""
    with contextlib.ExitStack() as stack:
        found: dict[str, Route] = {}
        for mode in modes:
            if mode == "vllm-router":
                leaders = tuple(s.url for s in servers)
                url, _ = stack.enter_context(peers.vllm_router(leaders, None, "cache_aware"))
                found[mode] = Route(url)
                continue
            config, ready = tmp / f"gw-{mode}.toml", tmp / f"gw-{mode}.json"
            config.write_text(gateway_toml(mode, servers, tokenizer))
            argv = ["gateway", "gateway", "--config", str(config), "--log-level", "warning"]
            argv += ["--ready-file", str(ready)]
            info = stack.enter_context(child(argv, ready, None, f"gateway ({mode})", True))
            found[mode] = Route(info["public"], info["metrics"])
        for mode in EVENTS:
            if mode in found:
                _wait_kv(found[mode], lambda f: f["trusted_units"] == len(servers), TRUST_S)
        yield found


def kv_figures(route: Route) -> dict[str, float]:
    return scrape.kv_figures(fetch(route.metrics + "/metrics"))


def wait_index_empty(route: Route) -> None:
    """After the caches' reset: a gateway reading the events has read every unit's
    AllBlocksCleared."""
    _wait_kv(route, lambda f: f["index_blocks"] == 0, EMPTY_S)


def _wait_kv(route: Route, done: Callable[[dict[str, float]], bool], within: float) -> None:
    deadline = time.monotonic() + within
    while not done(kv_figures(route)):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the gateway's KV figures: {kv_figures(route)}")
        time.sleep(0.2)
