"""vLLM's KV cache event publisher (`--kv-events-config`): the settings that turn it on, and
where a subscriber on the same machine reads a publisher started with given settings.

vLLM's ZMQ publisher binds its PUB socket only for a wildcard or IPC endpoint (`tcp://*:PORT`,
an address with `::`, `ipc://PATH`) and connects out to anything else, expecting a collector
to bind there; its replay socket (a ROUTER answering "every batch from number N on") binds
wherever it is told. So over TCP the events, the token ids of the prompts a unit caches,
listen on every interface, vLLM allowing no narrower address: `unitgate up` publishes those of
the units it starts over IPC instead (Unix sockets in a folder of the run only its user may
enter), read at the same address. A publisher the config sets up itself is read on loopback
where it binds TCP. Imports no vLLM.
"""

from __future__ import annotations

import json
import re
from typing import Any

ENGINE_ARG = "kv_events_config"  # its name among `vllm serve`'s arguments (--vllm-args)
TOPIC = "kv"  # what every message is prefixed with; the gateway subscribes to all of them
LOOPBACK = "127.0.0.1"
DEFAULT_ENDPOINT = "tcp://*:5557"  # vLLM's KVEventsConfig.endpoint
_TCP = re.compile(r"tcp://(?P<host>[^/]+):(?P<port>[0-9]{1,5})")
_ANY = ("*", "0.0.0.0")


def events_config(endpoint: str, replay: str) -> dict[str, Any]:
    """`--kv-events-config`'s value: events on for the unit's prefix cache, published over ZMQ
    at `endpoint`, the last batches kept for replay at `replay`."""
    return {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": endpoint,
        "replay_endpoint": replay,
        "topic": TOPIC,
    }


def readers(config: Any) -> tuple[str, str] | None:
    """Where a subscriber here reads a publisher started with `config` (`--kv-events-config`'s
    value, a dict or its JSON text): its events and its replay socket ("" = none). None when
    no subscriber here can connect to it: events off, another publisher, an endpoint it
    connects out from, or a bind address this machine's loopback does not reach."""
    if isinstance(config, str):
        try:
            config = json.loads(config)
        except json.JSONDecodeError:
            return None
    if not isinstance(config, dict) or config.get("enable_kv_cache_events") is not True:
        return None
    if config.get("publisher") not in (None, "zmq"):
        return None
    endpoint = config.get("endpoint", DEFAULT_ENDPOINT)
    if not isinstance(endpoint, str) or not binds(endpoint):
        return None
    events = _reader(endpoint)
    replay = config.get("replay_endpoint")
    replay_reader = _reader(replay) if isinstance(replay, str) else ""
    if events is None or replay_reader is None:
        return None
    return events, replay_reader


def binds(endpoint: str) -> bool:
    """vLLM's rule (ZmqEventPublisher._is_bind_endpoint): which endpoints its PUB socket binds."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


def _reader(bound: str) -> str | None:
    """Where this machine connects to a socket bound at `bound`."""
    if bound.startswith("ipc://"):
        return bound
    match = _TCP.fullmatch(bound)
    if match is None:
        return None
    host, port = match["host"], match["port"]
    if host in _ANY or host.startswith("127."):
        return f"tcp://{LOOPBACK if host in _ANY else host}:{port}"
    return None
