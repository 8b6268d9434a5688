"""A rollout's ask, checked against the fleet: defaults, and each mistake refused by name."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.config.rollout import HookConfig, RolloutConfig
from gateway.rollout.spec import Fleet, SpecError, parse

FLEET = Fleet(
    serving={"a": "v1", "b": "v1", "c": "v0"},
    carried={"a": frozenset({"v1", "v2"}), "b": frozenset({"v1", "v2"}), "c": frozenset({"v0"})},
)
CONFIG = RolloutConfig(
    hooks={
        "up": HookConfig(command=("true",), when=("prepare",)),
        "tell": HookConfig(url="http://127.0.0.1:9/x", when=("done",)),
    }
)


def refused(body: dict[str, Any], fleet: Fleet = FLEET) -> SpecError:
    with pytest.raises(SpecError) as err:
        parse(body, CONFIG, fleet)
    return err.value


def test_defaults_come_from_the_fleet_and_the_config() -> None:
    spec = parse({"to": "v2", "from": "v1"}, CONFIG, FLEET)
    assert spec.old == "v1" and spec.cells == ("a", "b")
    assert spec.steps == (5, 25, 50, 100) and spec.step_seconds == 300.0
    assert spec.looks == 8 and spec.gates.min_samples == 50 and spec.resume_across


def test_from_is_found_when_the_cells_agree_and_must_be_given_when_they_do_not() -> None:
    assert parse({"to": "v2", "cells": ["b", "a"]}, CONFIG, FLEET).cells == ("b", "a")
    error = refused({"to": "v2"})
    assert error.field == "from" and "'v0'" in str(error) and "'v1'" in str(error)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"to": "v9", "from": "v1"}, "to"),
        ({"to": "v2", "from": "v1", "steps": [25, 5, 100]}, "steps"),
        ({"to": "v2", "from": "v1", "steps": [5, 50]}, "steps"),
        ({"to": "v2", "from": "v1", "steps": [0, 100]}, "steps"),
        ({"to": "v2", "from": "v1", "steps": [50.5, 100]}, "steps"),
        ({"to": "v2", "from": "v1", "cells": ["a", "a"]}, "cells"),
        ({"to": "v2", "from": "v1", "cells": ["c"]}, "cells"),
        ({"to": "v2", "from": "v1", "cells": ["z"]}, "cells"),
        ({"to": "v2", "from": "v1", "hooks": ["rm"]}, "hooks"),
        ({"to": "v2", "from": "v1", "gates": {"alpha": "high"}}, "gates.alpha"),
        ({"to": "v2", "from": "v1", "gates": {"beta": 1}}, "gates.beta"),
        ({"to": "v2", "from": "v1", "gates": {"alpha": 1.5}}, "gates"),
        ({"to": "v2", "from": "v1", "step_seconds": 0}, "step_seconds"),
        ({"to": "v2", "from": "v1", "ready_timeout": True}, "ready_timeout"),
        ({"to": "v2", "from": "v1", "resume_across": "yes"}, "resume_across"),
        ({"to": "v2", "from": "v1", "golden": {"body": {}}}, "golden"),
        ({"to": "v2", "from": "v1", "golden": [{"body": {"stream": True}}]}, "golden"),
        ({"to": "v1", "from": "v1"}, "from"),
        ({"to": 2}, "to"),
        ({"from": "v1"}, "to"),
        ({"to": "v2", "from": "v1", "cellz": ["a"]}, "cellz"),
    ],
)
def test_each_mistake_names_its_field(body: dict[str, Any], field: str) -> None:
    error = refused(body)
    assert error.field == field, str(error)
    assert str(error).startswith(field)


def test_a_revision_no_unit_carries_needs_a_prepare_hook_to_add_it() -> None:
    assert refused({"to": "v3", "from": "v1"}).field == "to"
    assert refused({"to": "v3", "from": "v1", "hooks": ["tell"]}).field == "to"  # no prepare
    assert parse({"to": "v3", "from": "v1", "hooks": ["up"]}, CONFIG, FLEET).hooks == ("up",)


def test_a_saved_ask_reads_back_without_the_fleet() -> None:
    body = {"to": "v2", "from": "v1", "steps": [10, 100], "gates": {"min_samples": 5}}
    spec = parse(body, CONFIG, FLEET)
    again = parse(spec.wire(), CONFIG, None)
    assert again == spec
