"""[priority]: the default classes, the builder, errors that name the key, choosing a class."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.config.builder import table
from gateway.config.checks import ConfigError, FieldError
from gateway.config.priority import PriorityClass, PriorityConfig, from_toml


def _classes(*rows: dict[str, Any]) -> dict[str, Any]:
    return {"classes": list(rows), "default": rows[0]["name"]}


def test_defaults_are_interactive_standard_batch() -> None:
    config = from_toml({})
    assert config == PriorityConfig()
    assert [c.name for c in config.ranked] == ["interactive", "standard", "batch"]
    assert config.default == "standard" and not config.preempt
    assert [c.reserved_share for c in config.ranked] == [0.2, 0.0, 0.0]
    # Standard is what the engines assume without the field; lower is served sooner.
    assert [c.unit_priority for c in config.ranked] == [-1, 0, 1]
    assert config.get("batch").queue_timeout > config.get("interactive").queue_timeout


def test_classes_replace_the_defaults_and_are_ranked_whatever_their_order() -> None:
    config = from_toml(
        {
            "classes": [
                {"name": "bulk", "rank": 7, "queue_timeout": 30},
                {"name": "live", "rank": 2, "reserved_share": 0.5, "unit_priority": -5},
            ],
            "default": "bulk",
            "preempt": True,
        }
    )
    assert [c.name for c in config.ranked] == ["live", "bulk"]
    assert config.get("bulk").queue_timeout == 30.0  # an int is taken for a float
    assert config.preempt


def test_a_built_config_reads_back_as_its_table() -> None:
    config = from_toml({"preempt": True})
    assert from_toml(table(config)) == config


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        ({"clases": []}, "unknown key [priority].clases"),
        ({"preempt": 1}, "[priority].preempt must be of type bool, got 1"),
        ({"classes": []}, "[priority].classes must list at least one class"),
        ({"classes": [{"rank": 0}]}, "missing required key [priority].classes[0].name"),
        (_classes({"name": "Top", "rank": 0}), "[priority].classes[0].name must match"),
        (_classes({"name": "a", "rank": -1}), "[priority].classes[0].rank must be >= 0, got -1"),
        (
            _classes({"name": "a", "rank": 0, "reserved_share": 1.0}),
            "[priority].classes[0].reserved_share must be in [0, 1), got 1.0",
        ),
        (
            _classes({"name": "a", "rank": 0, "queue_size": -1}),
            "[priority].classes[0].queue_size must be >= 0, got -1",
        ),
        (
            _classes({"name": "a", "rank": 0, "queue_timeout": float("inf")}),
            "[priority].classes[0].queue_timeout must be >= 0 and finite",
        ),
        (
            _classes({"name": "a", "rank": 0, "unit_priority": 2**31}),
            "[priority].classes[0].unit_priority must fit in 32 bits",
        ),
        (
            _classes({"name": "a", "rank": 0, "ttft_slo": 0}),
            "[priority].classes[0].ttft_slo must be > 0 and finite (seconds), got 0",
        ),
        (
            _classes({"name": "a", "rank": 0, "shed_on_slo": True}),
            "[priority].classes[0].shed_on_slo needs the class's ttft_slo",
        ),
        (
            _classes({"name": "a", "rank": 0}, {"name": "a", "rank": 1}),
            "[priority].classes must have unique names, got ['a']",
        ),
        (
            _classes({"name": "a", "rank": 3}, {"name": "b", "rank": 3}),
            "[priority].classes must have unique ranks, got [3]",
        ),
        ({"default": "gold"}, "[priority].default must name a class of ['interactive', 'standard'"),
        (
            _classes(
                {"name": "a", "rank": 0, "reserved_share": 0.6},
                {"name": "b", "rank": 1, "reserved_share": 0.4},
                {"name": "c", "rank": 2},
            ),
            "[priority].classes must reserve less than 1 in all",
        ),
        (
            _classes({"name": "a", "rank": 0}, {"name": "b", "rank": 1, "reserved_share": 0.1}),
            "[priority].classes must give its least important class reserved_share = 0 (nobody"
            " ranks below it), got 'b.reserved_share = 0.1'",
        ),
        (
            _classes({"name": "a", "rank": 0, "unit_priority": 3}, {"name": "b", "rank": 1}),
            "got 'a.unit_priority = 3 > b.unit_priority = 0'",
        ),
    ],
)
def test_errors_name_the_key_and_the_value(raw: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigError) as caught:
        from_toml(raw)
    assert needle in str(caught.value)


def test_every_problem_is_reported_at_once() -> None:
    with pytest.raises(ConfigError) as caught:
        from_toml({"classes": [{"name": "a", "rank": 0}, {"name": "a", "rank": 0}], "default": "x"})
    keys = sorted(e.key for e in caught.value.errors)
    assert keys == ["[priority].classes", "[priority].classes", "[priority].default"]


def test_built_directly_the_first_bad_value_raises() -> None:
    with pytest.raises(FieldError) as caught:
        PriorityClass("a", rank=0, queue_size=-3)
    assert (caught.value.name, caught.value.value) == ("queue_size", -3)


def test_a_request_runs_in_the_class_it_asks_for_clamped_to_its_keys_highest() -> None:
    config = PriorityConfig()
    assert config.resolve(None) == "standard"  # no header, no key: the config's default
    assert config.resolve(" Batch ") == "batch"  # a header value, any case
    assert config.resolve("interactive") == "interactive"  # no auth: no ceiling
    assert config.resolve("interactive", highest="standard") == "standard"
    assert config.resolve("batch", highest="standard") == "batch"  # asking lower is fine
    assert config.resolve(None, default="batch") == "batch"  # the key's default
    assert config.resolve(None, highest="batch") == "batch"  # defaults are clamped too
    with pytest.raises(KeyError):
        config.resolve("gold")
