"""`UNITGATE__SECTION__KEY` environment overrides: any key, typed and checked like the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config import Config, ConfigError, load_config
from gateway.config import env as config_env
from gateway.config.builder import build, table

FILE = """
[gateway]
models = ["m"]

[timeouts]
total = 600

[[units]]
id = "u0"
leader = "http://127.0.0.1:9000"

[[units]]
id = "u1"
leader = "http://127.0.0.1:9001"
"""


@pytest.fixture
def path(tmp_path: Path) -> Path:
    found = tmp_path / "gw.toml"
    found.write_text(FILE)
    return found


def errors(path: Path, environ: dict[str, str]) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        load_config(path, environ)
    return [m.removeprefix(f"{path}: ") for m in caught.value.messages()]


def test_scalars_lists_and_tables_are_typed(path: Path) -> None:
    config = load_config(
        path,
        {
            "UNITGATE__TIMEOUTS__TOTAL": "900",
            "UNITGATE__GATEWAY__PORT": "9000",
            "UNITGATE__GATEWAY__HOST": "0.0.0.0",  # bare text where the key takes text
            "UNITGATE__GATEWAY__WORKERS": "auto",
            "UNITGATE__GATEWAY__MODELS": '["m", "n"]',
            "UNITGATE__HEALTH__ENABLED": "false",
            "UNITGATE__UNITS__1__LEADER": "http://10.0.0.5:8000",
            "UNITGATE__UNITS__1__HEADERS": '{X-Team = "a"}',
            "UNITGATE__METRICS": '{port = 9100, host = "127.0.0.1"}',
            "UNITGATE_ADMIN_TOKEN": "not an override: one underscore",
        },
    )
    assert config.timeouts.total == 900.0 and config.gateway.port == 9000
    assert (config.gateway.host, config.gateway.workers) == ("0.0.0.0", "auto")
    assert config.gateway.models == ("m", "n") and config.health.enabled is False
    assert config.units[1].leader == "http://10.0.0.5:8000"
    assert config.units[1].headers == {"X-Team": "a"}
    assert config.units[0].leader == "http://127.0.0.1:9000"  # the file's, untouched
    assert (config.metrics.port, config.timeouts.idle) == (9100, 30.0)


def test_text_keys_keep_their_text(path: Path) -> None:
    config = load_config(
        path,
        {
            "UNITGATE__UNITS__0__ID": "007",  # TOML would read a number
            "UNITGATE__UNITS__1__ID": '"quoted"',  # a TOML string: its content
            "UNITGATE__ADMIN__TOKEN_ENV": "true",
        },
    )
    assert [u.id for u in config.units] == ["007", "quoted"]
    assert config.admin.token_env == "true"


def test_units_are_added_by_the_next_index(path: Path) -> None:
    config = load_config(
        path,
        {
            "UNITGATE__UNITS__2__ID": "u2",
            "UNITGATE__UNITS__2__LEADER": "http://127.0.0.1:9002",
            "UNITGATE__UNITS__3": '{id = "u3", leader = "http://127.0.0.1:9003"}',
            "UNITGATE__UNITS__3__WEIGHT": "2",  # on top of the whole table
        },
    )
    assert [u.id for u in config.units] == ["u0", "u1", "u2", "u3"]
    assert config.units[3].weight == 2.0


def test_sections_missing_from_the_file_are_made(tmp_path: Path) -> None:
    path = tmp_path / "empty.toml"
    path.write_text("")
    config = load_config(
        path,
        {"UNITGATE__UNITS__0__ID": "a", "UNITGATE__UNITS__0__LEADER": "http://h:1"},
    )
    assert [(u.id, u.leader) for u in config.units] == [("a", "http://h:1")]


def test_errors_name_the_variable_and_the_key(path: Path) -> None:
    found = errors(
        path,
        {
            "UNITGATE__TIMEOUTS__TOTL": "1",
            "UNITGATE__TIMEOUTS__IDLE": "soon",
            "UNITGATE__GATEWAY__PORT": "70000",
            "UNITGATE__UNITS__5__ID": "x",
            "UNITGATE__UNITS__X__ID": "x",
            "UNITGATE__TIMEOUTS__TOTAL__MORE": "1",
            "UNITGATE__": "1",
            "UNITGATE__UNITS__0": '{id = "u0"}',
        },
    )
    assert found == [
        "UNITGATE__: empty part in the name (parts are separated by '__')",
        "UNITGATE__TIMEOUTS__TOTAL__MORE: [timeouts].total is one value: set it whole, nothing"
        " inside it ('MORE')",
        "UNITGATE__TIMEOUTS__TOTL: unknown key [timeouts].totl; known keys:"
        " ['connect', 'first_byte', 'idle', 'total']",
        "UNITGATE__UNITS__X__ID: [units] is a list: 'X' must be an index",
        "UNITGATE__UNITS__5__ID: [units] has 2 entries, so a new one takes index 2, got 5",
        "[gateway].port must be 0..65535 (0 = any free port), got 70000"
        " (from UNITGATE__GATEWAY__PORT)",
        "[timeouts].idle must be of type float, got 'soon' (from UNITGATE__TIMEOUTS__IDLE)",
        "missing required key [units][0].leader (from UNITGATE__UNITS__0)",
    ]


def test_file_errors_are_not_blamed_on_a_variable(path: Path) -> None:
    path.write_text(FILE.replace("total = 600", "total = -1"))
    found = errors(path, {"UNITGATE__TIMEOUTS__IDLE": "5"})
    assert found == ["[timeouts].total must be a positive number, got -1.0"]


def test_no_variables_no_change(path: Path) -> None:
    assert load_config(path, {}) == load_config(path, {"OTHER": "1"})


def test_workers_get_the_overridden_config_once(path: Path) -> None:
    """Workers rebuild the config from `table()`, not from the file: an override reaches
    them as a value, and nothing applies it a second time."""
    config = load_config(path, {"UNITGATE__UNITS__2": '{id = "u2", leader = "http://h:1"}'})
    rebuilt = build(Config, table(config), "")
    assert rebuilt == config and len(rebuilt.units) == 3


def test_overrides_apply_tables_before_their_keys() -> None:
    found, problems = config_env.overrides(
        Config,
        {
            "UNITGATE__UNITS__10__ID": "b",
            "UNITGATE__UNITS__2__ID": "a",
            "UNITGATE__UNITS": "[]",
            "UNITGATE__UNITS__2": "{}",
        },
    )
    assert problems == []
    assert [o.var for o in found] == [
        "UNITGATE__UNITS",
        "UNITGATE__UNITS__2",
        "UNITGATE__UNITS__2__ID",
        "UNITGATE__UNITS__10__ID",
    ]
    assert [o.key for o in found][2:] == ["[units][2].id", "[units][10].id"]


def test_overlay_gives_raw_readers_the_same_tables() -> None:
    raw = {"units": [{"id": "u0", "leader": "http://h:1"}]}
    merged = config_env.overlay(Config, raw, {"UNITGATE__UNITS__0__LEADER": "http://h:2"})
    assert merged["units"][0]["leader"] == "http://h:2"
    assert raw["units"][0]["leader"] == "http://h:1"  # not changed in place
    with pytest.raises(ConfigError, match="UNITGATE__UNITZ: unknown key"):
        config_env.overlay(Config, raw, {"UNITGATE__UNITZ": "[]"})
