"""The priority classes and the top tenants for the status page, read from the gateway's metrics.

Like traffic.py: read when the feed builds a snapshot (at most every READ_EVERY_S, only while a
page watches), never on the request path. Per class: waiting and in flight now (admission's,
or in a control plane the workers' reports), the admission wait's p50 and p99 and the refusals
per second over the last WINDOW_S, and the fairness index (fairness.py). Per tenant label (the
top `[metrics].tenants_top` and "other"): requests, tokens and 429s per second and the class
mix of its requests, busiest first. Counters and histograms include the workers' sums in a
control plane (fleet.py).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from gateway.observability.fairness import index
from gateway.observability.metrics import Metrics
from gateway.status.traffic import READ_EVERY_S, WINDOW_S, quantile

Labels = tuple[tuple[str, str], ...]
Key = tuple[str, Labels]  # (sample name, sorted labels)
View = dict[str, list[dict[str, Any]]]  # "classes" and "tenants", as the snapshot carries them


class Increase:
    """How much each cumulative sample grew over the last `window_s` (pure: clock passed)."""

    def __init__(self, window_s: float = WINDOW_S) -> None:
        self.window_s = window_s
        self._history: deque[tuple[float, dict[Key, float]]] = deque()

    def update(self, now: float, current: dict[Key, float]) -> tuple[float, dict[Key, float]]:
        """(seconds covered, each sample's growth since the oldest reading kept)."""
        history = self._history
        history.append((now, current))
        while len(history) > 2 and now - history[1][0] >= self.window_s:
            history.popleft()
        since, base = history[0]
        grown = {k: max(0.0, v - base.get(k, 0.0)) for k, v in current.items()}
        return now - since, grown


def classes(
    grown: dict[Key, float],
    elapsed: float,
    now: dict[str, tuple[int, int]],
    fairness: dict[str, float],
    names: tuple[str, str],
) -> list[dict[str, Any]]:
    """One row per class: `names` are the wait histogram's and the refusals counter's."""
    wait, refusals = names
    buckets: dict[str, dict[float, float]] = {}
    refused: dict[str, float] = {}
    for (sample, labels), value in grown.items():
        d = dict(labels)
        if sample == wait + "_bucket":
            bounds = buckets.setdefault(d["class"], {})
            bound = float(d["le"])
            bounds[bound] = bounds.get(bound, 0.0) + value
        elif sample == refusals + "_total":
            refused[d["class"]] = refused.get(d["class"], 0.0) + value
    rows = []
    for name in sorted({*now, *buckets, *refused}):
        waiting, held = now.get(name, (0, 0))
        rows.append(
            {
                "name": name,
                "waiting": waiting,
                "in_flight": held,
                "wait_p50": quantile(0.5, buckets.get(name, {})),
                "wait_p99": quantile(0.99, buckets.get(name, {})),
                "refused_per_s": _per_s(refused.get(name, 0.0), elapsed),
                "fairness": fairness.get(name),
            }
        )
    return rows


def tenants(
    grown: dict[Key, float], elapsed: float, names: tuple[str, str, str]
) -> list[dict[str, Any]]:
    """One row per tenant label, busiest first: `names` are the tenant families'."""
    requests, tokens, rejections = (n + "_total" for n in names)
    rows: dict[str, dict[str, Any]] = {}
    for (sample, labels), value in grown.items():
        d = dict(labels)
        if sample not in (requests, tokens, rejections):
            continue
        row = rows.get(d["tenant"])
        if row is None:
            row = rows[d["tenant"]] = {"tenant": d["tenant"], "rps": 0.0, "tokens_per_s": 0.0}
            row |= {"refused_per_s": 0.0, "classes": {}}
        rate = _per_s(value, elapsed)
        if sample == requests:
            row["rps"] += rate
            mix = row["classes"]
            mix[d["class"]] = mix.get(d["class"], 0.0) + rate
        elif sample == tokens:
            row["tokens_per_s"] += rate
        elif d.get("reason") == "saturated":
            row["refused_per_s"] += rate
    busy = [r for r in rows.values() if r["rps"] or r["refused_per_s"]]
    return sorted(busy, key=lambda r: (-r["rps"], -r["tokens_per_s"], r["tenant"]))


def _per_s(value: float, elapsed: float) -> float:
    return value / elapsed if elapsed > 0 else 0.0


class ClassesAndTenants:
    """What the feed asks for: `classes` and `tenants` added to a snapshot."""

    def __init__(self, metrics: Metrics, clock: Callable[[], float] = time.monotonic) -> None:
        self._metrics, self._clock = metrics, clock
        m = metrics
        self._families = (m.queue_wait, m.class_rejections, *_tenant_families(m))
        self._names = tuple(_name(f) for f in self._families)
        self._increase = Increase()
        self._last: tuple[float, View] | None = None

    def annotate(self, snapshot: dict[str, Any]) -> None:
        now = self._clock()
        if self._last is None or now - self._last[0] >= READ_EVERY_S:
            self._last = (now, self._view(now))
        snapshot.update(self._last[1])

    def _view(self, now: float) -> View:
        m = self._metrics
        elapsed, grown = self._increase.update(now, self._read())
        held = dict(m.by_class()) if m.by_class is not None else {}
        wait, refusals, requests, tokens, rejections = self._names
        return {
            "classes": classes(grown, elapsed, held, index(m.shares()), (wait, refusals)),
            "tenants": tenants(grown, elapsed, (requests, tokens, rejections)),
        }

    def _read(self) -> dict[Key, float]:
        out: dict[Key, float] = {}
        for each in self._families:
            for family in each.collect():
                for s in family.samples:
                    key = (s.name, tuple(sorted(s.labels.items())))
                    out[key] = out.get(key, 0.0) + s.value
        fleet = self._metrics.fleet
        if fleet is not None:  # a control plane: the workers count the requests
            for (family_name, name, labels), value in fleet.totals().items():
                if family_name in self._names:
                    out[(name, labels)] = out.get((name, labels), 0.0) + value
        return out


def _tenant_families(m: Metrics) -> tuple[Any, Any, Any]:
    t = m.tenants
    return t.requests, t.tokens, t.rejections


def _name(metric: Any) -> str:
    name = getattr(metric, "name", None)
    if isinstance(name, str):  # the project's own histogram families
        return name
    families: Iterable[Any] = metric.collect()
    return str(next(iter(families)).name)
