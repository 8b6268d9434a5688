"""What the rules and the dashboard may name: the series the gateway exports, read from a real
`Metrics` (so a renamed metric breaks these tests, not an operator's alert at 3 am), and the
metric names a PromQL expression uses."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import yaml

from gateway.observability.events import EventLog
from gateway.observability.looplag import LoopLag
from gateway.observability.metrics import Metrics
from gateway.observability.rollout_metrics import RolloutCollector, RolloutEnds
from gateway.units import UnitRegistry
from tests.support import ROOT, gateway_config

PROMETHEUS_DIR = ROOT / "deploy" / "prometheus"
RULES = PROMETHEUS_DIR / "unitgate-rules.yml"
RUNBOOK = PROMETHEUS_DIR / "RUNBOOK.md"
MISSING = "{tool} is missing: `make test` installs it as root (apt-get install prometheus)"

# A sample name per family type: what a scrape of that family yields.
SUFFIXES = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_count", "_sum"),
    "gauge": ("",),
    "info": ("_info",),
}
# PromQL words that look like metric names: functions, aggregations, keywords.
_WORD = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_LABELS = re.compile(r"\{[^}]*\}")
_STRINGS = re.compile(r'"[^"]*"')


def tool(name: str) -> str:
    """The path of a Prometheus binary, or a failure that says how to install it."""
    path = shutil.which(name)
    assert path is not None, MISSING.format(tool=name)
    return path


def exported_series() -> set[str]:
    """Every sample name a gateway's /metrics can hold, from its own registry."""
    unit = {"id": "u0", "leader": "http://127.0.0.1:9", "nodes": ["http://127.0.0.1:9"]}
    registry = UnitRegistry(gateway_config([unit]))
    metrics = Metrics(registry, lambda: 0, LoopLag())
    # What the admin API registers beside them, where it drives rollouts (admin/runtime.py).
    metrics.registry.register(RolloutCollector(lambda: None))
    RolloutEnds(metrics.registry, EventLog())
    names: set[str] = set()
    for family in metrics.registry.collect():
        names.update(family.name + suffix for suffix in SUFFIXES[family.type])
    return names


def metric_names(expr: str) -> set[str]:
    """The metric (and recorded series) names an expression selects: label matchers, strings
    and `by (...)` clauses removed, then every word with a `unitgate_` prefix or a colon."""
    text = _STRINGS.sub('""', expr)
    text = _LABELS.sub("", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    return {w for w in _WORD.findall(text) if w.startswith("unitgate_") or ":" in w}


def rules(path: Path = RULES) -> list[dict[str, Any]]:
    """Every rule of every group, recording and alerting."""
    doc = yaml.safe_load(path.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def recorded() -> set[str]:
    return {str(rule["record"]) for rule in rules() if "record" in rule}
