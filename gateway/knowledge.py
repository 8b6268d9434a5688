"""What the gateway knows of its units beyond their health, for routing: which blocks their
prefix caches hold (their engines' KV events, gateway/kvevents), how fast each answers (the
latency forecast, gateway/routing/forecast.py), and conversations' earlier turns. Made with
the gateway, fed by the request path's signals and the units' membership, exported as
metrics, and stopped with it (server.py hosts it)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from gateway.config import Config, UnitConfig
from gateway.health_states import Lag
from gateway.kvevents.turns import Turns
from gateway.observability.kv_metrics import KvCollector
from gateway.observability.latency_metrics import (
    Figures,
    LatencyCollector,
    PredictionObserver,
    ratio_family,
)
from gateway.observability.metrics import Metrics
from gateway.proxy.call import Call
from gateway.proxy.forecast_feed import ForecastFeed
from gateway.proxy.turns_feed import TurnsFeed
from gateway.routing.forecast import Forecast
from gateway.routing.latency import lag_reason
from gateway.routing.overtaken import probation
from gateway.signals import Signals
from gateway.units import UnitRegistry

if TYPE_CHECKING:
    from gateway.kvevents.fleet import KvFleet
    from gateway.kvevents.prompts import Prompts


class UnitKnowledge:
    def __init__(
        self,
        config: Config,
        units: UnitRegistry,
        signals: Signals[Call],
        metrics: Metrics,
        public: bool,
        workers: Figures | None = None,
    ) -> None:
        """`public`: this process serves requests (it learns from them); `workers`: the
        control plane's view of its workers' latency figures (they learn, it does not)."""
        self.config, self.units, self.workers = config, units, workers
        r = config.routing
        # Each unit's latency, learned from its answers.
        window = config.hedge.budget_window
        self.forecast = Forecast(window=window) if r.latency_model != "off" and public else None
        # Which units' caches hold which blocks, from their KV events: made when a unit names
        # a publisher (`kv_events`; its import of zmq is the `kv` extra's), with the path.
        self.kv: KvFleet | None = None
        self.prompts: Prompts | None = None  # each model's tokenizer, with the path
        # Conversations' turns' prompt ids, for models without a tokenizer (kvevents/turns.py).
        keep = r.prefix_scorer == "auto" and r.conversation_tokens > 0 and public
        self.turns = Turns(r.conversation_tokens) if keep else None
        if self.turns is not None:
            signals.subscribe(TurnsFeed(self.turns))
        metrics.registry.register(KvCollector(lambda: self.kv, lambda: self.turns))
        if self.forecast is not None:
            clock = _clock()
            signals.subscribe(ForecastFeed(self.forecast, clock))
            ratio = ratio_family()
            metrics.registry.register(ratio)
            signals.subscribe(PredictionObserver(ratio, clock, metrics.registry))
        metrics.registry.register(LatencyCollector(self.latency_figures))

    def latency_figures(self) -> Mapping[str, Mapping[str, float]]:
        """Each unit's learned latency figures (Forecast.figures), or its workers'."""
        if self.workers is not None:
            return self.workers()
        return self.forecast.figures() if self.forecast is not None else {}

    def lagging(self, unit_id: str) -> Lag | None:
        """Why the unit's learned latency lags the fleet's, or a hedge keeps overtaking its
        copies (probation), for its prober (None: neither)."""
        if self.config.routing.latency_model == "off":
            return None
        figures = self.latency_figures()
        factor = self.config.health.prefill_lag_factor
        if factor > 0:
            per_k = {u: f["ttft_1k_idle"] for u, f in figures.items() if "ttft_1k_idle" in f}
            lag = lag_reason(per_k, unit_id, factor)
            if lag is not None:
                return Lag(lag)
        shares = {u: f["overtaken_share"] for u, f in figures.items() if "overtaken_share" in f}
        return probation(shares, unit_id, self.config.hedge.probation)

    async def load_prompts(self) -> Prompts | None:
        """Each model's tokenizer (`[routing] tokenizers`), loaded off the loop; None when
        the prefix is scored approximately or not at all."""
        r = self.config.routing
        if not r.tokenizers or r.prefix_scorer != "auto":
            return None
        from gateway.kvevents.prompts import Prompts

        self.prompts = await asyncio.to_thread(Prompts, r.tokenizers)
        return self.prompts

    def depths(self, prompt: Sequence[int], units: Iterable[str]) -> Mapping[str, int]:
        return {} if self.kv is None else self.kv.depths(prompt, units)

    def join(self, unit: UnitConfig) -> None:
        """Read the unit's KV events, if it names a publisher."""
        if not unit.kv_events:
            return
        if self.kv is None:
            from gateway.kvevents.fleet import KvFleet

            self.kv = KvFleet(self.config.routing.kv_index_blocks, self._vocabulary)
            if self.turns is not None:  # a unit's cache is known: a turn's ids are worth keeping
                self.turns.active = True
        self.kv.join(unit)

    def leave(self, unit_id: str) -> None:
        """The unit left the fleet: what was learned of it goes."""
        if self.forecast is not None:
            self.forecast.drop(unit_id)
        if self.kv is not None:
            self.kv.leave(unit_id)

    async def stop(self) -> None:
        if self.kv is not None:
            await self.kv.stop()
            self.kv = None

    def _vocabulary(self, unit: UnitConfig) -> int | None:
        """The unit's model's vocabulary, where the gateway has its tokenizer."""
        prompts, state = self.prompts, self.units.units.get(unit.id)
        if prompts is None or state is None:
            return None
        return next((v for m in state.models if (v := prompts.vocabulary(m)) is not None), None)


def _loop_time() -> float:
    return asyncio.get_running_loop().time()


def _clock() -> Callable[[], float]:
    """The running loop's own `time` (asked on every request: no Python frame, no lookup of
    the loop), or, built with no loop running, whichever loop runs when it is asked."""
    try:
        return asyncio.get_running_loop().time
    except RuntimeError:
        return _loop_time
