"""The gateway's Prometheus metrics, one registry per gateway instance.

Gauges that mirror state the gateway already keeps (in-flight per unit, queue depth,
routability) are read at scrape time by a collector instead of being updated on every request.

The counters alerts and dashboards look for (breaker transitions, resumptions, admission
refusals) start at 0 for every unit, state and reason: a series that first appears already at
1 has no earlier sample, so Prometheus' `increase()` and `rate()` would miss that first event
(deploy/prometheus alerts on them).

Series that a request adds carry the serving unit and, where it matters (requests, tokens,
first-token latency, duration), the model the client asked for: a model is one of
`[gateway].models` (another is refused before it is counted), so their number is bounded by
the unit-model pairs the fleet serves. The request path's observer keeps the children it
uses (request_metrics.py), so a request pays a dict lookup, not a `.labels()` call. The
per-tenant families bound their `tenant` label to the top `[metrics].tenants_top` (tenants.py).

`render` takes the encoder prometheus_client chose for the scrape's Accept header: the
Prometheus text format, or OpenMetrics when asked (app.py).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from gateway.config.proxy import TimeoutConfig
from gateway.health.breaker import BreakerState
from gateway.health_states import Health
from gateway.observability import process
from gateway.observability.counter import CounterFamily
from gateway.observability.fairness import Shares, merged
from gateway.observability.fleet import Fleet
from gateway.observability.gcpause import GcPauses
from gateway.observability.histogram import HistogramFamily, reaching
from gateway.observability.looplag import LoopLag
from gateway.observability.tenants import FairnessCollector, TenantFamilies
from gateway.outcomes import Resumption
from gateway.units import UnitRegistry

Encoder = Callable[[CollectorRegistry], bytes]


class Metrics:
    def __init__(
        self,
        units: UnitRegistry,
        queue_depth: Callable[[], int],
        lag: LoopLag | None = None,
        longest: float = TimeoutConfig().total,
        by_class: Callable[[], Mapping[str, tuple[int, int]]] | None = None,
    ) -> None:
        """`longest`: `[timeouts].total`, where the latency histograms' buckets reach."""
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        # Incremented by every request: lock-free (counter.py).
        self.requests = CounterFamily(
            "unitgate_requests",
            "Requests answered, by serving unit, model and HTTP status (unit and model `none`"
            " when refused before either was known).",
            ["unit", "model", "status"],
            registry=r,
        )
        self.retries = Counter(
            "unitgate_retries",
            "Requests re-sent to another unit, by failure kind.",
            ["kind"],
            registry=r,
        )
        self.budget_exhausted = Counter(
            "unitgate_retry_budget_exhausted",
            "Retries refused because the retry budget was spent.",
            registry=r,
        )
        self.hedges = Counter(
            "unitgate_hedges",
            "Hedged requests' second copies, by priority class and outcome: fired (sent after"
            " the delay), tied (sent at once, to units that announce their starts), first or"
            " second (whose answer began first), refused_budget, refused_overloaded,"
            " refused_no_unit (not sent). A hedge is not a retry: unitgate_retries does not"
            " count them.",
            ["class", "outcome"],
            registry=r,
        )
        self.unit_hedges = Counter(
            "unitgate_unit_hedges",
            "Hedged requests by unit and its copy's role: hedged (its first copy got a second,"
            " after the delay or tied), won (its copy's answer began first), lost (its copy was"
            " cancelled). A unit whose first copies often lose is a straggler.",
            ["unit", "role"],
            registry=r,
        )
        self.hedge_tokens = Counter(
            "unitgate_hedge_prefill_tokens",
            "Uncached prompt tokens, by priority class and kind: base (every request's first"
            " copy, with hedging on: the budget's base), sent (the second copies', what the"
            " budget counts; a tied twin's only if it started) and wasted (the cancelled"
            " copies'; a tied pair's loser's only if it started). sent over base, over the"
            " budget's window, is the budget's use against [hedge].budget_share.",
            ["class", "kind"],
            registry=r,
        )
        self.resumptions = Counter(
            "unitgate_resumptions",
            "Streams broken after their first byte, by the unit that broke them and what the "
            "gateway did: ok (continued on another unit), gave_up (resume limit, budget or no "
            "unit left), unsupported (the unit returned no token ids).",
            ["unit", "outcome"],
            registry=r,
        )
        self.cancellations = Counter(
            "unitgate_cancellations",
            "Requests whose client went away before the answer ended.",
            ["unit"],
            registry=r,
        )
        self.upstream_failures = Counter(
            "unitgate_upstream_failures",
            "Failed attempts at a unit, by kind.",
            ["unit", "kind"],
            registry=r,
        )
        self.tokens = CounterFamily(
            "unitgate_tokens",
            "Tokens by serving unit, model and type (prompt, completion): a resumable stream's"
            " counted from the token ids its units sent, any other answer's as its own usage"
            " says (a plain stream's only when its client asked for usage).",
            ["unit", "model", "type"],
            registry=r,
        )
        self.routed = CounterFamily(
            "unitgate_routing_decisions",
            "Attempts placed, by how their unit was chosen: predicted (the latency model),"
            " cached (the longest prefix the units' KV events show), affinity (a session or the"
            " prefix hash), load (power of two choices), home (the unit holding a stored"
            " response).",
            ["how"],
            registry=r,
        )
        self.rejections = Counter(
            "unitgate_admission_rejections",
            "Requests refused by admission control.",
            ["reason"],
            registry=r,
        )
        self.class_rejections = Counter(
            "unitgate_class_rejections",
            "Requests refused by admission control, by priority class and reason (saturated:"
            " 429, no_routable_unit: 503).",
            ["class", "reason"],
            registry=r,
        )
        self.breaker_transitions = Counter(
            "unitgate_breaker_transitions",
            "Circuit breaker state changes per unit, by new state (or 'suppressed').",
            ["unit", "to"],
            registry=r,
        )
        self.health_transitions = Counter(
            "unitgate_health_transitions",
            "Prober verdict changes per unit, by new state (healthy, slow or unhealthy).",
            ["unit", "to"],
            registry=r,
        )
        # Counted on failures only, through children cached per node: the common probe is free.
        self.probe_failures = Counter(
            "unitgate_probe_failures",
            "Failed /health probes, by unit and node rank.",
            ["unit", "rank"],
            registry=r,
        )
        long = reaching(longest)
        self.ttft = HistogramFamily(
            "unitgate_time_to_first_token_seconds",
            "Request arrival to the first event of a streamed answer with status 200, by unit"
            " and model (non-streamed answers and errors are not counted).",
            ("unit", "model"),
            long,
        )
        self.itl = HistogramFamily(
            "unitgate_inter_token_latency_seconds", "Time between relayed stream chunks.", "unit"
        )
        self.e2e = HistogramFamily(
            "unitgate_request_duration_seconds",
            "Request arrival to the end of the answer, by unit and model.",
            ("unit", "model"),
            long,
        )
        self.queue_wait = HistogramFamily(
            "unitgate_queue_wait_seconds",
            "Time from asking admission for a slot to getting one, by priority class (0 when"
            " a slot was free; every attempt of a retried request asks again).",
            "class",
            long,
        )
        # Per tenant, the tenant label bounded (tenants.py): the observer sits in the server.
        self.tenants = TenantFamilies(r)
        self.by_class = by_class  # each class's (waiting, in flight), for the status page too
        for family in (self.ttft, self.itl, self.e2e, self.queue_wait):
            r.register(family)
        for reason in ("saturated", "no_routable_unit"):
            self.rejections.labels(reason)
        for unit in list(units.units.values()):
            self._zero(unit.id)
        units.on_membership(lambda unit, added: self._zero(unit.id) if added else None)
        r.register(_StateCollector(units, queue_depth, by_class))
        r.register(_HealthCollector(units))
        if lag is not None:
            r.register(_LagCollector(lag))
        # Garbage collections and their pauses: timed once the gateway starts (install).
        self.gc = GcPauses()
        r.register(self.gc.family)
        process.register(r)
        # In a control plane: the workers' counters and histograms, summed in at render,
        # fresh from `refresh` (which asks them) before each scrape.
        self.fleet: Fleet | None = None
        self.refresh: Callable[[], Awaitable[None]] | None = None
        # This process's fairness window (the tenants' observer's, set by the server).
        self.window: Callable[[], Shares] = dict
        r.register(FairnessCollector(self.shares))

    def shares(self) -> Shares:
        """Tokens per tenant per class over the fairness window: this process's, and in a
        control plane its workers' as they last sent them."""
        own = self.window()
        return own if self.fleet is None else merged([own, *self.fleet.shares()])

    def _zero(self, unit_id: str) -> None:
        """The unit's breaker transitions and resumptions, exported at 0 from its start (see
        above): their first increase shows in alerts and in the dashboard's rates."""
        for state in (*BreakerState, "suppressed"):
            self.breaker_transitions.labels(unit_id, state)
        for outcome in Resumption:
            self.resumptions.labels(unit_id, outcome)

    def render(self, encoder: Encoder = generate_latest) -> bytes:
        """Call from a worker thread (see app.py): with a thousand units rendering takes ~0.5 s
        of Python, which on the event loop would stall probes past their timeout."""
        if self.fleet is not None:
            return encoder(self.fleet.merged(self.registry))
        return encoder(self.registry)


class _StateCollector(Collector):
    def __init__(
        self,
        units: UnitRegistry,
        queue_depth: Callable[[], int],
        by_class: Callable[[], Mapping[str, tuple[int, int]]] | None = None,
    ) -> None:
        self.units = units
        self.queue_depth = queue_depth
        self.by_class = by_class

    def collect(self) -> Iterator[GaugeMetricFamily]:
        inflight = GaugeMetricFamily(
            "unitgate_unit_inflight", "Requests in flight per unit.", labels=["unit"]
        )
        routable = GaugeMetricFamily(
            "unitgate_unit_routable", "1 when the unit may take new requests.", labels=["unit"]
        )
        # Tells an alert "out of routing" apart from "taken out by an operator" (disabled or
        # draining), which must not page.
        in_service = GaugeMetricFamily(
            "unitgate_unit_in_service",
            "1 while the operator allows the unit (enabled, not draining).",
            labels=["unit"],
        )
        # Each unit's cell and revision, to join on `unit` (they are no label of the per-unit
        # series: a rollout changes no series' identity, and dashboards and rules stay valid).
        info = GaugeMetricFamily(
            "unitgate_unit_info",
            "1 for each unit, labelled with its cell and its revision.",
            labels=["unit", "cell", "revision"],
        )
        for unit in list(self.units.units.values()):  # a snapshot: scrapes run off the loop
            info.add_metric([unit.id, unit.cell, unit.revision], 1.0)
            inflight.add_metric([unit.id], unit.inflight)
            routable.add_metric([unit.id], 1.0 if unit.routable else 0.0)
            in_service.add_metric([unit.id], 1.0 if unit.in_service else 0.0)
        panic = GaugeMetricFamily(
            "unitgate_panic_routing",
            "1 while a model's units are panic-routed: too few routable, so units out for soft "
            "reasons or by their breaker take traffic too.",
            labels=["model"],
        )
        active = dict(self.units.panic)
        for model in self.units.models:
            panic.add_metric([model], 1.0 if model in active else 0.0)
        yield info
        yield inflight
        yield routable
        yield in_service
        yield panic
        yield GaugeMetricFamily(
            "unitgate_queue_depth", "Requests waiting for a unit slot.", value=self.queue_depth()
        )
        if self.by_class is not None:
            waiting = GaugeMetricFamily(
                "unitgate_class_queue_depth",
                "Requests waiting for a unit slot, by priority class.",
                labels=["class"],
            )
            running = GaugeMetricFamily(
                "unitgate_class_in_flight",
                "Requests holding a unit slot, by priority class.",
                labels=["class"],
            )
            for name, (queued, held) in self.by_class().items():
                waiting.add_metric([name], queued)
                running.add_metric([name], held)
            yield waiting
            yield running


class _HealthCollector(Collector):
    """The prober's latest view, read at scrape time instead of written on every probe."""

    def __init__(self, units: UnitRegistry) -> None:
        self.units = units

    def collect(self) -> Iterator[GaugeMetricFamily]:
        unit_ok = GaugeMetricFamily(
            "unitgate_unit_healthy",
            "1 while the prober judges the unit usable (healthy or slow).",
            labels=["unit"],
        )
        state = GaugeMetricFamily(
            "unitgate_unit_health_state",
            "1 for the unit's current health state: unknown, healthy, slow or unhealthy.",
            labels=["unit", "state"],
        )
        node_ok = GaugeMetricFamily(
            "unitgate_node_healthy",
            "1 when the node's last probe was fine (absent: unprobed).",
            labels=["unit", "rank"],
        )
        latency = GaugeMetricFamily(
            "unitgate_node_probe_latency_seconds",
            "Duration of the node's last answered probe.",
            labels=["unit", "rank"],
        )
        # What the node's last answered probe reported: with both, an alert can tell a stalled
        # engine (work pending, step frozen) from an idle one, over a longer window than the
        # prober's own `stall_timeout`.
        step = GaugeMetricFamily(
            "unitgate_node_engine_step",
            "The engine step the node last reported (absent: no answer).",
            labels=["unit", "rank"],
        )
        pending = GaugeMetricFamily(
            "unitgate_node_engine_pending",
            "Requests pending on the node's engine, as it last reported (absent: no answer).",
            labels=["unit", "rank"],
        )
        for unit in list(self.units.units.values()):  # a snapshot: scrapes run off the loop
            unit_ok.add_metric([unit.id], 1.0 if unit.healthy else 0.0)
            health = unit.health
            for each in Health:
                state.add_metric([unit.id, each.value], 1.0 if each is health else 0.0)
            for node in unit.nodes:
                labels = [unit.id, str(node.rank)]
                if node.healthy is not None:
                    node_ok.add_metric(labels, 1.0 if node.healthy else 0.0)
                if node.latency_ms is not None:
                    latency.add_metric(labels, node.latency_ms / 1000)
                if node.step is not None:
                    step.add_metric(labels, node.step)
                if node.pending is not None:
                    pending.add_metric(labels, node.pending)
        yield unit_ok
        yield state
        yield node_ok
        yield latency
        yield step
        yield pending


class _LagCollector(Collector):
    def __init__(self, lag: LoopLag) -> None:
        self.lag = lag

    def collect(self) -> Iterator[GaugeMetricFamily | HistogramMetricFamily]:
        h = self.lag.histogram
        family = HistogramMetricFamily(
            "unitgate_event_loop_lag_seconds",
            "How late the gateway's event loop ran its lag timer (due 50 ms after a late tick, up "
            "to 0.5 s apart while on time): its own saturation.",
        )
        family.add_metric([], h.cumulative(), h.sum)
        yield family
        yield GaugeMetricFamily(
            "unitgate_event_loop_lag_max_seconds",
            "The largest event loop lag seen since start.",
            value=self.lag.max,
        )
