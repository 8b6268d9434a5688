"""deploy/prometheus, checked with the real tools (Debian's `prometheus` package, which `make
test` installs as root): `promtool check rules` and `check config`, and `promtool test rules`
on every file of deploy/prometheus/tests, which fire and clear each alert on synthetic series.

Beside those, what promtool cannot know: every alert has a test in which it fires and one in
which it does not, every alert carries a summary and a runbook line whose section exists in
RUNBOOK.md, and every metric the rules name is one the gateway exports.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.promql import (
    PROMETHEUS_DIR,
    RULES,
    RUNBOOK,
    exported_series,
    metric_names,
    recorded,
    rules,
    tool,
)

TESTS = sorted((PROMETHEUS_DIR / "tests").glob("*.yml"))


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [tool("promtool"), *args], capture_output=True, text=True, timeout=60, cwd=PROMETHEUS_DIR
    )


def alerts() -> list[dict[str, Any]]:
    return [rule for rule in rules() if "alert" in rule]


def test_promtool_checks_the_rules() -> None:
    done = promtool("check", "rules", str(RULES))
    assert done.returncode == 0, done.stdout + done.stderr


def test_promtool_checks_the_example_config() -> None:
    """prometheus.yml as shipped. Its commented Kubernetes job cannot be checked here: Debian
    builds Prometheus without Kubernetes service discovery."""
    done = promtool("check", "config", "prometheus.yml")
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("path", TESTS, ids=[p.stem for p in TESTS])
def test_promtool_unit_tests_pass(path: Path) -> None:
    done = promtool("test", "rules", str(path))
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_alert_is_tested_firing_and_not_firing() -> None:
    fires: set[str] = set()
    quiet: set[str] = set()
    for path in TESTS:
        doc = yaml.safe_load(path.read_text())
        assert doc["rule_files"] == ["../unitgate-rules.yml"], path
        for case in doc["tests"]:
            for check in case.get("alert_rule_test", []):
                (fires if check.get("exp_alerts") else quiet).add(check["alertname"])
    names = {rule["alert"] for rule in alerts()}
    assert names - fires == set(), "alerts never tested firing"
    assert names - quiet == set(), "alerts never tested not firing"
    assert (fires | quiet) - names == set(), "tests of alerts that do not exist"


def test_the_alerts_the_issue_asks_for_exist() -> None:
    assert {rule["alert"] for rule in alerts()} >= {
        "UnitgateGatewayDown",
        "UnitgateUnitOutOfRouting",
        "UnitgateNodeProbesFailing",
        "UnitgateEngineStalled",
        "UnitgateBreakerEjected",
        "UnitgateNoRoutableUnit",
        "UnitgatePanicRouting",
        "UnitgateTTFTHigh",
        "UnitgateRetryBudgetExhausted",
        "UnitgateResumptionsGivingUp",
    }


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to dashes."""
    return re.sub(r"[^a-z0-9 _-]", "", heading.strip().lower()).replace(" ", "-")


def test_every_alert_has_a_summary_and_a_runbook_section() -> None:
    sections = {
        anchor(line[3:]) for line in RUNBOOK.read_text().splitlines() if line.startswith("## ")
    }
    names = set()
    for rule in alerts():
        name = rule["alert"]
        names.add(anchor(name))
        notes = rule.get("annotations", {})
        assert notes.get("summary"), f"{name}: no summary"
        assert notes.get("description"), f"{name}: no description"
        assert rule.get("labels", {}).get("severity") in {"warning", "critical"}, name
        assert notes.get("runbook") == f"deploy/prometheus/RUNBOOK.md#{anchor(name)}", name
        assert anchor(name) in sections, f"{name}: no section in RUNBOOK.md"
    assert sections - names == set(), "RUNBOOK.md sections for no alert"


def test_the_rules_name_only_series_that_exist() -> None:
    """A typo in a metric name is no PromQL error: the alert would just never fire."""
    exported, records = exported_series(), recorded()
    for rule in rules():
        unknown = metric_names(rule["expr"]) - exported - records
        assert unknown == set(), (rule.get("alert") or rule.get("record"), unknown)
