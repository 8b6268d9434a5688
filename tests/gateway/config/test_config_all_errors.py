"""A bad config reports every problem at once, each naming its key and value."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config import ConfigError, GatewayConfig, config_from_dict, load_config
from gateway.config.builder import build

UNIT = {"id": "u0", "leader": "http://127.0.0.1:9000"}


def errors_of(raw: dict[str, object]) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        config_from_dict(raw)
    return caught.value.messages()


def test_every_section_and_unit_is_reported() -> None:
    found = errors_of(
        {
            "gateway": {"port": 70000, "prot": 1},
            "timeouts": {"total": -1, "idle": "x"},
            "units": [{"id": "u0"}, {**UNIT, "id": "u1", "leader": "localhost:9", "weight": 0}],
            "nope": {},
        }
    )
    assert found == [
        "unknown key [nope]; known keys: " + found[0].split("known keys: ")[1],
        "unknown key [gateway].prot; known keys: " + found[1].split("known keys: ")[1],
        "[gateway].port must be 0..65535 (0 = any free port), got 70000",
        "[timeouts].idle must be of type float, got 'x'",
        "[timeouts].total must be a positive number, got -1.0",
        "missing required key [units][0].leader",
        "[units][1].leader must be a base URL like http://host:port, got 'localhost:9'",
        "[units][1].weight must be > 0, got 0.0",
    ]


def test_every_rule_of_one_section_is_reported() -> None:
    found = errors_of({"retry": {"max_attempts": 0, "budget_ratio": 2}, "units": [UNIT]})
    assert any(m.startswith("[retry].max_attempts") for m in found)
    assert any(m.startswith("[retry].budget_ratio must be 0..1") for m in found)


def test_a_single_error_is_itself_and_str_joins_many() -> None:
    with pytest.raises(ConfigError) as one:
        config_from_dict({"gateway": {"port": "80"}})
    assert one.value.errors == (one.value,)
    assert str(one.value) == "[gateway].port must be of type int, got '80'"
    assert one.value.key == "[gateway].port"
    with pytest.raises(ConfigError) as many:
        config_from_dict({"gateway": {"port": "80", "host": 1}})
    assert str(many.value).splitlines() == many.value.messages()
    assert [e.key for e in many.value.errors] == ["[gateway].port", "[gateway].host"]


def test_rules_comparing_sections_wait_for_the_sections() -> None:
    # [gateway] is broken, so its default models must not make the unit's models look wrong.
    found = errors_of({"gateway": {"models": "m"}, "units": [{**UNIT, "models": ["m"]}]})
    assert found == ["[gateway].models must be a list, got 'm'"]


def test_a_valid_table_still_builds() -> None:
    assert build(GatewayConfig, {"port": 1, "workers": "auto"}, "gateway").port == 1


def test_load_config_names_the_file_on_every_line(tmp_path: Path) -> None:
    path = tmp_path / "gw.toml"
    path.write_text('[gateway]\nport = -1\nhost = 3\n[[units]]\nid = "u0"\n')
    with pytest.raises(ConfigError) as caught:
        load_config(path, {})
    assert caught.value.messages() == [
        f"{path}: [gateway].host must be of type str, got 3",
        f"{path}: [gateway].port must be 0..65535 (0 = any free port), got -1",
        f"{path}: missing required key [units][0].leader",
    ]
