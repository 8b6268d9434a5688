"""JSON Schemas (draft 2020-12, as OpenAPI 3.1 uses) of the admin API's bodies and answers.

They describe what the handlers really send: objects list every key they carry and allow no
other, so tests/gateway/admin/test_admin_openapi.py fails when a handler's answer and its schema
part ways. gateway/admin/openapi.py puts them in the OpenAPI document.
"""

from __future__ import annotations

from typing import Any

from gateway.config.unit import BACKENDS, KINDS, WEIGHT_DTYPES

Schema = dict[str, Any]

ADMIN_STATES = ("enabled", "disabled", "draining", "drained")
HEALTH_STATES = ("unknown", "healthy", "slow", "unhealthy")  # gateway.health_states.Health
BASE_URL = "^https?://[^/]+/?$"  # gateway.config.checks.base_url
CELL = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"  # gateway.config.unit's cell names
BREAKER_STATES = ("admitting", "ejected", "probing")  # gateway.health.breaker.BreakerState


def obj(properties: dict[str, Schema], *optional: str, about: str = "") -> Schema:
    """An object with exactly these keys, all required but the `optional` ones."""
    schema: Schema = {
        "type": "object",
        "properties": properties,
        "required": [name for name in properties if name not in optional],
        "additionalProperties": False,
    }
    if about:
        schema["description"] = about
    return schema


def of(kind: str | list[str], about: str = "", **more: Any) -> Schema:
    """A value of JSON type `kind` (a list: any of them, e.g. ["number", "null"])."""
    schema: Schema = {"type": kind, **more}
    if about:
        schema["description"] = about
    return schema


def ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def strings(about: str = "") -> Schema:
    return of("array", about, items=of("string"))


ERROR = obj(
    {
        "error": obj(
            {
                "message": of("string", "What went wrong; for a bad body it names the key."),
                "type": of(
                    "string",
                    "The kind of failure, as in the OpenAI API.",
                    examples=["invalid_request_error", "authentication_error"],
                ),
                "param": of(["string", "null"]),
                "code": of(
                    ["string", "null"],
                    "A stable code: invalid_body, invalid_query, missing_token, invalid_token, "
                    "unit_not_found, unit_exists, key_not_found, state_not_saved, "
                    "state_store_unavailable.",
                ),
            }
        )
    },
    about="Every error, in the OpenAI API's shape.",
)

NODE = obj(
    {
        "url": of("string", "The node's health URL."),
        "role": of("string", enum=["leader", "follower"]),
        "rank": of("integer", minimum=0),
        "healthy": of(["boolean", "null"], "null until the first probe."),
        "latency_ms": of(["number", "null"], "The last probe's round trip."),
        "error": of(["string", "null"], "Why the last probe failed."),
        "step": of(["integer", "null"], "The engine's step count, where the node reports it."),
        "pending": of(["integer", "null"], "Requests waiting in the engine, where reported."),
        "kv_usage": of(["number", "null"], "The KV cache's share in use, where reported."),
    }
)

BREAKER = {
    "type": "object",
    "description": "The circuit breaker's state. Without a breaker ([breaker].enabled = false) "
    "only `state` (and `reason` when ejected) are present.",
    "properties": {
        "state": of("string", enum=list(BREAKER_STATES)),
        "reason": of("string"),
        "ejected_until": of(["number", "null"], "The gateway's monotonic clock at its end."),
        "ejection_left": of(["number", "null"], "Seconds until the ejection ends."),
        "consecutive_ejections": of("integer", minimum=0),
        "consecutive_failures": of("integer", minimum=0),
        "window_requests": of("integer", minimum=0),
        "window_failures": of("integer", minimum=0),
        "trial_successes": of(["integer", "null"], "While probing: trial requests that passed."),
    },
    "required": ["state"],
    "additionalProperties": False,
}

REPLICA = obj(
    {
        "in_flight": of("integer", minimum=0),
        "version": of("integer", "The shared state version the replica has applied."),
        "age_s": of("number", "How old its last report is."),
    }
)

FLEET = {
    "description": 'With shared state ([state] backend = "redis") only: the unit across '
    "every replica, or why that cannot be read.",
    "oneOf": [
        obj(
            {
                "in_flight": of("integer", "Over every live replica.", minimum=0),
                "current": of("boolean", "Every replica has applied this one's state."),
                "replicas": of("object", additionalProperties=ref("Replica")),
            }
        ),
        obj({"error": of("string")}),
    ],
}

UNIT = obj(
    {
        "id": of("string"),
        "routable": of("boolean", "True when health, breaker and admin all let it serve."),
        "panic_routed": of("boolean", "Routed only because too few units are routable."),
        "cell": of("string", "The cell it belongs to (rollouts move one cell at a time)."),
        "revision": of("string", "Its revision label."),
        "idle": of(
            "string",
            "Why routing leaves it out though health, breaker and admin allow it: its revision "
            "is not its cell's; empty when not for that reason.",
        ),
        "health": obj(
            {
                "state": of("string", enum=list(HEALTH_STATES)),
                "healthy": of("boolean"),
                "hard": of("boolean", "Unhealthy on hard evidence: panic routing skips it."),
                "reason": of("string"),
            },
            about="The prober's verdict.",
        ),
        "breaker": ref("Breaker"),
        "admin": obj(
            {
                "state": of(
                    "string",
                    '"drained" is "draining" with nothing left in flight.',
                    enum=list(ADMIN_STATES),
                ),
                "reason": of("string"),
                "who": of("string", 'The admin token\'s name, "config", or "local".'),
                "since": of("number", "Unix time of the change."),
            },
            about="The operator's choice.",
        ),
        "in_flight": of("integer", "Requests running on it through this gateway.", minimum=0),
        "resume": obj(
            {
                "token_ids": of(["boolean", "null"], "null until a stream has run on it."),
                "note": of("string"),
            },
            about="Whether its broken streams can be resumed on another unit.",
        ),
        "drained": of("boolean", "Out of service by the admin and nothing in flight."),
        "leader": of("string"),
        "kind": of("string", enum=list(KINDS)),
        "served_model": of(["string", "null"]),
        "weight": of("number"),
        "cap": of("integer", "The in-flight cap now in force."),
        "models": strings(),
        "nodes": of("array", items=ref("Node")),
        "why": of("string", "Why it takes traffic or not, in one line."),
        "fleet": ref("Fleet"),
    },
    "fleet",
)

UNIT_LIST = obj(
    {
        "units": of("array", items=ref("Unit")),
        "panic": of(
            "object",
            "Models in panic routing, each with why.",
            additionalProperties=of("string"),
        ),
    }
)

NEW_UNIT = {
    "type": "object",
    "description": "A unit as in a [[units]] table of the config file; a null value means "
    "the default. It is not routable until its probes pass.",
    "properties": {
        "id": of("string", "Unique; no spaces or '/'.", minLength=1),
        "leader": of("string", "The leader's base URL.", pattern=BASE_URL),
        "nodes": of(
            "array",
            "Every node's base URL in rank order, the leader first (default: [leader]).",
            items=of("string", pattern=BASE_URL),
        ),
        "weight": of("number", exclusiveMinimum=0),
        "max_inflight": of("integer", minimum=1),
        "models": strings("Models it serves, among [gateway].models (default: all)."),
        "enabled": of("boolean"),
        "kind": of("string", enum=list(KINDS)),
        "served_model": of("string"),
        "api_key_env": of("string"),
        "headers": of("object", additionalProperties=of("string")),
        "cell": of("string", 'Its cell (default "default").', pattern=CELL),
        "revision": of(
            "string",
            "Its revision label: a unit of another revision than its cell's gets traffic "
            "only once a rollout moves the cell to it.",
            maxLength=128,
        ),
        "tls_ca": of("string"),
        "tls_cert": of("string"),
        "tls_key": of("string"),
        "health_path": of("string"),
        "load_interval": of("number", exclusiveMinimum=0),
        "backend": of("string", enum=list(BACKENDS)),
        "model": of("string"),
        "max_seq_len": of("integer", minimum=1),
        "pp": of("integer", minimum=1),
        "weight_dtype": of("string", enum=list(WEIGHT_DTYPES)),
        "prefill_chunk": of("integer", minimum=1),
        "engine_args": of("object"),
        "priority": of(
            "boolean",
            "Send each request's class as `priority` (with [priority]; default: builtin units).",
        ),
        "kv_events": of(
            "string",
            "Its vLLM KV event publisher, tcp://HOST:PORT or ipc://PATH (routing by its cache).",
        ),
        "kv_events_replay": of("string", "The publisher's replay socket (with kv_events)."),
    },
    "required": ["id", "leader"],
    "additionalProperties": False,
}

REASON = obj({"reason": of("string", "Why; recorded in the events log.")}, "reason")

REMOVED = obj(
    {
        "id": of("string"),
        "removed": of("boolean", const=True),
        "in_flight": of("integer", "Requests still running on it; they finish.", minimum=0),
    }
)

EVENT = obj(
    {
        "time": of("number", "Unix time."),
        "unit": of("string"),
        "what": of("string", examples=["disable", "drain", "enable", "add", "unhealthy"]),
        "reason": of("string"),
        "who": of("string", '"prober", "breaker", or the admin token\'s name.'),
        "replica": of("string", "With shared state: the replica that recorded it."),
    },
    "replica",
)

EVENTS = obj(
    {
        "events": of("array", "Oldest first.", items=ref("Event")),
        "source": of("string", "With shared state: whose log this is.", enum=["shared", "local"]),
        "warning": of("string", "Why only this replica's events are shown."),
    },
    "source",
    "warning",
)

MILLISECONDS = obj({"p50": of("number"), "p99": of("number"), "max": of("number")})

WORKER = obj(
    {
        "index": of("integer", minimum=0),
        "pid": of(["integer", "null"], "null while it is restarted."),
        "up_s": of(["number", "null"]),
        "restarts": of("integer", minimum=0),
        "applied": of("integer", "The state version it applied (-1: none yet)."),
        "requests": of("integer", minimum=0),
        "propagation_ms": {
            "description": "State propagation times, null before the first.",
            "oneOf": [ref("Milliseconds"), {"type": "null"}],
        },
    }
)

WORKERS = obj(
    {"workers": of("array", "Empty with one process.", items=ref("Worker"))},
)

OPENAPI = {"type": "object", "description": "This document (OpenAPI 3.1)."}

SCHEMAS: dict[str, Schema] = {
    "Error": ERROR,
    "Unit": UNIT,
    "Node": NODE,
    "Breaker": BREAKER,
    "Fleet": FLEET,
    "Replica": REPLICA,
    "UnitList": UNIT_LIST,
    "NewUnit": NEW_UNIT,
    "Reason": REASON,
    "Removed": REMOVED,
    "Event": EVENT,
    "Events": EVENTS,
    "Worker": WORKER,
    "Milliseconds": MILLISECONDS,
    "Workers": WORKERS,
    "OpenApi": OPENAPI,
}
