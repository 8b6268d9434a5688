"""Unit kinds, names and credentials in the config: defaults, and errors that name the key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gateway.config import ConfigError, config_from_dict, load_config
from gateway.config.unit import UnitConfig


def unit(**fields: Any) -> dict[str, Any]:
    return {"units": [{"id": "u0", "leader": "http://127.0.0.1:9000", **fields}]}


def test_defaults_are_todays_contract() -> None:
    u = config_from_dict(unit()).units[0]
    assert (u.kind, u.served_model, u.api_key_env, u.headers, u.health_path) == (
        "unitgate",
        "",
        "",
        {},
        "",
    )
    assert u.header_lines() == b""


def test_stock_kinds_and_their_fields() -> None:
    u = config_from_dict(
        unit(kind="vllm", served_model="smol", headers={"X-Team": "shop"}, load_interval=0.5)
    ).units[0]
    assert (u.kind, u.served_model, u.load_interval) == ("vllm", "smol", 0.5)
    o = config_from_dict(unit(kind="openai", health_path="/ping")).units[0]
    assert o.health_path == "/ping"


def test_the_api_key_comes_from_the_environment_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("U0_KEY", "sekret-1")
    u = config_from_dict(unit(kind="vllm", api_key_env="U0_KEY", headers={"X-A": "b"})).units[0]
    assert u.header_lines() == b"X-A: b\r\nAuthorization: Bearer sekret-1\r\n"
    assert "sekret" not in repr(u) and "sekret" not in str(config_from_dict(unit()))


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"kind": "tgi"},
            "[units][0].kind must be one of ('unitgate', 'vllm', 'openai'), got 'tgi'",
        ),
        ({"api_key_env": "UNITGATE_TEST_UNSET"}, "[units][0].api_key_env names an environment"),
        ({"headers": {"Authorization": "x"}}, "[units][0].headers is set by the gateway itself"),
        ({"headers": {"Host": "x"}}, "[units][0].headers is set by the gateway itself"),
        ({"headers": {"bad name": "x"}}, "[units][0].headers must map header names"),
        ({"headers": {"X-A": 1}}, "[units][0].headers must map header names to string values"),
        ({"headers": {"X-A": "a\r\nX-B: c"}}, "[units][0].headers must have a printable ASCII"),
        ({"health_path": "/ping"}, '[units][0].health_path only applies to "openai"'),
        ({"kind": "openai", "health_path": "ping"}, "[units][0].health_path must be a path"),
        ({"kind": "vllm", "model": "/m"}, '[units][0].model only applies to kind = "unitgate"'),
        ({"kind": "vllm", "backend": "vllm"}, '[units][0].backend only applies to kind = "unit'),
        ({"kind": "vllm", "load_interval": 0}, "[units][0].load_interval must be a positive"),
        ({"served_model": " x"}, "[units][0].served_model must not start or end with spaces"),
    ],
)
def test_bad_fields_name_the_key(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        config_from_dict(unit(**fields))
    assert message in str(caught.value)


def test_a_key_that_is_not_printable_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("U0_KEY", "bad\u00e9key")
    with pytest.raises(ConfigError, match=r"api_key_env holds a key that is not printable"):
        config_from_dict(unit(api_key_env="U0_KEY"))


def test_served_model_needs_one_public_model() -> None:
    raw = {"gateway": {"models": ["a", "b"]}, **unit(served_model="smol")}
    with pytest.raises(ConfigError, match="served_model needs exactly one"):
        config_from_dict(raw)
    raw["units"][0]["models"] = ["b"]
    assert config_from_dict(raw).units[0].served_model == "smol"


def test_up_starts_only_units_of_its_own_kind() -> None:
    from gateway.launcher.up.plan import plan_units

    config = config_from_dict(
        {
            "units": [
                {"id": "own", "leader": "http://127.0.0.1:9001"},
                {"id": "stock", "leader": "http://127.0.0.1:9002", "kind": "vllm"},
            ]
        }
    )
    plan = plan_units(config)
    assert [u.unit for u in plan.units] == ["own"]
    assert plan.skipped == ("stock",)


def test_unit_config_builds_directly() -> None:
    assert UnitConfig(id="u", leader="http://h:1/", kind="openai").nodes == ("http://h:1",)


def test_what_each_unit_answers() -> None:
    from gateway.paths import RESUMABLE, ROUTED, served

    assert served("unitgate", "builtin") == RESUMABLE
    assert served("unitgate", "vllm") == ROUTED  # vLLM's own server on the leader
    assert served("vllm", "builtin") == served("openai", "builtin") == ROUTED


def test_the_commented_stock_unit_in_config_toml_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The example at the end of config.toml, uncommented, is a valid unit."""
    text = (Path(__file__).parents[3] / "config.toml").read_text()
    example = text[text.index('# [[units]]\n# id = "v0"') :]
    toml = "\n".join(line.removeprefix("# ") for line in example.splitlines())
    monkeypatch.setenv("V0_API_KEY", "k")
    path = tmp_path / "c.toml"
    path.write_text('[gateway]\nmodels = ["m"]\n' + toml + "\n")
    unit = load_config(path).units[0]
    assert (unit.kind, unit.served_model, len(unit.nodes)) == ("vllm", "smol", 2)
