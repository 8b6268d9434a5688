"""A unit's KV event publisher in the config: the addresses it takes, errors that name the key,
and the `kv` extra it needs."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest

from gateway.config import ConfigError, config_from_dict


def unit(**fields: Any) -> dict[str, Any]:
    return {"units": [{"id": "u0", "leader": "http://127.0.0.1:9000", "kind": "vllm", **fields}]}


def test_off_by_default() -> None:
    u = config_from_dict(unit()).units[0]
    assert (u.kv_events, u.kv_events_replay) == ("", "")
    assert config_from_dict(unit()).routing.kv_index_blocks == 1_000_000


@pytest.mark.parametrize(
    ("events", "replay"),
    [
        ("tcp://10.0.0.5:5557", "tcp://10.0.0.5:5558"),
        ("tcp://leader-0.unit-a:5557", ""),
        ("tcp://[::1]:5557", ""),
        ("ipc:///run/vllm/kv", "ipc:///run/vllm/kv-replay"),
    ],
)
def test_publisher_addresses(events: str, replay: str) -> None:
    u = config_from_dict(unit(kv_events=events, kv_events_replay=replay)).units[0]
    assert (u.kv_events, u.kv_events_replay) == (events, replay)


@pytest.mark.parametrize(
    ("fields", "key", "message"),
    [
        ({"kv_events": "tcp://*:5557"}, "kv_events", "must be tcp://HOST:PORT or ipc://PATH"),
        ({"kv_events": "10.0.0.5:5557"}, "kv_events", "must be tcp://HOST:PORT"),
        ({"kv_events": "tcp://h:70000"}, "kv_events", "must be tcp://HOST:PORT"),
        ({"kv_events": "ipc://"}, "kv_events", "ipc://PATH"),
        ({"kv_events_replay": "tcp://h:5558"}, "kv_events_replay", "needs kv_events"),
        (
            {"kv_events": "tcp://h:5557", "kv_events_replay": "http://h:5558"},
            "kv_events_replay",
            "must be tcp://HOST:PORT",
        ),
    ],
)
def test_bad_addresses_name_the_key(fields: dict[str, Any], key: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        config_from_dict(unit(**fields))
    assert key in str(caught.value)


def test_the_index_size_is_checked() -> None:
    with pytest.raises(ConfigError, match="kv_index_blocks"):
        config_from_dict({**unit(), "routing": {"kv_index_blocks": 0}})


def test_without_the_kv_extra_the_error_says_how_to_get_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "zmq" else real(name, *a)
    )
    with pytest.raises(ConfigError, match=r"needs zmq: pip install 'unitgate\[kv\]'"):
        config_from_dict(unit(kv_events="tcp://h:5557"))


def test_the_prefix_scorer_and_tokenizers(tmp_path: Any) -> None:
    (tmp_path / "tokenizer.json").write_text("{}")
    raw = {
        "gateway": {"models": ["m"]},
        "routing": {"prefix_scorer": "approximate", "tokenizers": {"m": str(tmp_path)}},
    }
    r = config_from_dict(raw).routing
    assert (r.prefix_scorer, r.tokenizers) == ("approximate", {"m": str(tmp_path)})
    assert config_from_dict({}).routing.prefix_scorer == "auto"


@pytest.mark.parametrize(
    ("routing", "message"),
    [
        ({"prefix_scorer": "exact"}, "prefix_scorer"),
        ({"latency_model": "on"}, "latency_model must be one of"),
        ({"tokenizers": {"m": "/nowhere"}}, "must name a folder holding tokenizer.json"),
        ({"tokenizers": {"other": "FOLDER"}}, "names models not in"),
    ],
)
def test_bad_routing_keys_are_named(tmp_path: Any, routing: dict[str, Any], message: str) -> None:
    (tmp_path / "tokenizer.json").write_text("{}")
    if "tokenizers" in routing:
        routing = {
            "tokenizers": {
                k: v.replace("FOLDER", str(tmp_path)) for k, v in routing["tokenizers"].items()
            }
        }
    with pytest.raises(ConfigError, match=message):
        config_from_dict({"gateway": {"models": ["m"]}, "routing": routing})
