"""Config loading: defaults, and errors that name the bad key."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config import ConfigError, config_from_dict, load_config

UNIT = {"id": "u0", "leader": "http://127.0.0.1:9000"}


def test_repository_config_loads() -> None:
    config = load_config(Path(__file__).parents[3] / "config.toml")
    assert [u.id for u in config.units] == ["u0", "u1"]
    # The leader answers /health on a listener of its own, beside its API port.
    assert (config.units[0].leader, config.units[0].nodes[0]) == (
        "http://127.0.0.1:8101",
        "http://127.0.0.1:8100",
    )


def test_defaults() -> None:
    config = config_from_dict({"units": [UNIT]})
    assert config.gateway.port == 8080 and config.metrics.port == 8081
    assert config.units[0].nodes == ("http://127.0.0.1:9000",)
    assert config.unit_cap(config.units[0]) == config.admission.unit_max_inflight
    assert config.upstream.max_connections == 0


def test_ints_accepted_for_floats() -> None:
    assert config_from_dict({"timeouts": {"idle": 5}}).timeouts.idle == 5.0


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        ({"gatway": {}}, "unknown key [gatway]"),
        ({"gateway": {"prot": 1}}, "unknown key [gateway].prot"),
        ({"gateway": {"port": "80"}}, "[gateway].port must be of type int"),
        ({"gateway": {"port": 70000}}, "[gateway].port must be 0..65535"),
        ({"gateway": {"port": True}}, "[gateway].port must be of type int"),
        ({"timeouts": {"first_byte": -1}}, "[timeouts].first_byte must be a positive number"),
        ({"routing": {"affinity": "sticky"}}, "[routing].affinity must be one of"),
        ({"routing": {"cached_load_factor": 0.5}}, "[routing].cached_load_factor must be >= 1.0"),
        ({"gateway": {"front": "nginx"}}, "[gateway].front must be one of"),
        (
            {"gateway": {"models": ["a", "b"], "default_model": "c"}},
            "[gateway].default_model must be one of [gateway].models ['a', 'b'], got 'c'",
        ),
        ({"retry": {"budget_ratio": 2}}, "[retry].budget_ratio must be 0..1"),
        ({"units": [{"id": "u0"}]}, "missing required key [units][0].leader"),
        (
            {"units": [{"id": "u0", "leader": "127.0.0.1:9"}]},
            "[units][0].leader must be a base URL",
        ),
        ({"units": [UNIT, UNIT]}, "unit ids must be unique"),
        ({"units": [{**UNIT, "weight": 0}]}, "[units][0].weight must be > 0"),
        ({"units": [{**UNIT, "models": ["x"]}]}, "lists models not in [gateway].models"),
        ({"units": {"id": "u0"}}, "[units] must be a list"),
        ({"gateway": 3}, "[gateway] must be a table"),
        ({"state": {"backend": "etcd"}}, "[state].backend must be one of ('sqlite', 'redis')"),
        ({"state": {"url": "http://r:6379"}}, "[state].url must be a redis/rediss/unix:// URL"),
        ({"state": {"url": "redis://:pw@r:6379"}}, "[state].url must not hold a password"),
        ({"state": {"key_prefix": "a:b"}}, "[state].key_prefix must be a non-empty name"),
        ({"state": {"tls_ca_file": "/ca.pem"}}, "[state].tls_ca_file only applies to a rediss"),
        ({"state": {"timeout": 0}}, "[state].timeout must be > 0 seconds"),
        ({"state": {"replica": "a b"}}, "[state].replica must be a name without spaces"),
        ({"state": {"heartbeat": 0}}, "[state].heartbeat must be a positive number"),
        ({"state": {"replica_ttl": 0.5}}, "[state].replica_ttl must be at least 4 heartbeats"),
        ({"state": {"events_kept": 10}}, "[state].events_kept must be >= 100"),
        ({"gateway": {"root_path": "llm"}}, "[gateway].root_path must be"),
        ({"gateway": {"root_path": "/llm/"}}, "[gateway].root_path must be"),
        ({"gateway": {"root_path": "/a//b"}}, "[gateway].root_path must be"),
        ({"gateway": {"root_path": "/a?b"}}, "[gateway].root_path must be"),
    ],
)
def test_errors_name_the_key(raw: dict[str, object], needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        config_from_dict(raw)
    assert needle in str(err.value)


def test_file_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[gateway\n")
    with pytest.raises(ConfigError, match=r"bad\.toml: not valid TOML"):
        load_config(bad)
    wrong = tmp_path / "wrong.toml"
    wrong.write_text("[timeouts]\nidle = 'x'\n")
    with pytest.raises(ConfigError, match=r"wrong\.toml: \[timeouts\]\.idle"):
        load_config(wrong)


def test_the_redis_password_comes_from_the_env_or_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = tmp_path / "pw"
    secret.write_text("from-file\nignored\n")
    state = config_from_dict({"state": {"backend": "redis", "password_file": str(secret)}}).state
    monkeypatch.delenv("UNITGATE_REDIS_PASSWORD", raising=False)
    assert state.password() == "from-file"
    monkeypatch.setenv("UNITGATE_REDIS_PASSWORD", "from-env")
    assert state.password() == "from-env"  # the env var wins
    assert config_from_dict({}).state.backend == "sqlite"  # the default: nothing shared
