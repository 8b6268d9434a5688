"""Settings of the request path: listeners, timeouts, upstream pool, routing, retries, units."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from gateway.config.checks import check as _check
from gateway.config.checks import installed
from gateway.config.checks import positive as _positive
from gateway.config.tls import check_pair as _check_tls
from gateway.envchoice import env_choice


@dataclass(frozen=True, slots=True)
class ListenerConfig:
    host: str = "127.0.0.1"
    port: int = 8080
    # Serve HTTPS: a PEM certificate (chain) file and its private key file, both or neither.
    tls_cert: str = ""
    tls_key: str = ""

    def __post_init__(self) -> None:
        _check(0 <= self.port <= 65535, "port", self.port, "must be 0..65535 (0 = any free port)")
        _check_tls(self.tls_cert, self.tls_key)


# Which relay streams answers ([upstream] relay; gateway/relay/: native or Python).
RELAYS = ("auto", "native", "python")
FRONTS = ("lean", "aiohttp")
FRONT_ENV = "UNITGATE_FRONT"


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    host: str = "127.0.0.1"
    port: int = 8080
    # Model ids the gateway serves; a unit may narrow this with its own `models`.
    models: tuple[str, ...] = ("unitgate-sim",)
    # The model of a request that names none (where its API allows that): one of `models`.
    # "": the only entry of `models`; with several, such a request gets 400.
    default_model: str = ""
    max_body_bytes: int = 4 * 1024 * 1024
    # How long in-flight streams may run on after SIGTERM before they are cancelled.
    shutdown_timeout: float = 30.0
    # Processes accepting on `port` (SO_REUSEPORT), or "auto": one per CPU this process may
    # use. With more than one, a control-plane process runs the probers, breakers and admin
    # API, and the workers route from its state (docs/operating.md: "The gateway on every core").
    workers: int | str = 1
    # Serve HTTPS: a PEM certificate (chain) file and its private key file, both or neither.
    tls_cert: str = ""
    tls_key: str = ""
    # Browser origins allowed to call the API (CORS), e.g. "https://app.example"; "*" = any.
    # Empty: no CORS headers at all.
    cors_origins: tuple[str, ...] = ()
    # What serves the public listener: "lean" (the proxy's routes on a protocol of the
    # gateway's own, everything else by aiohttp) or "aiohttp" (all of it). UNITGATE_FRONT
    # overrides it.
    front: str = "lean"
    # A path prefix every public route is served under as well as at its own path (vLLM's
    # `--root-path`): for a proxy in front that forwards "/llm/v1/..." as it came. "" = none.
    root_path: str = ""

    def __post_init__(self) -> None:
        _check(0 <= self.port <= 65535, "port", self.port, "must be 0..65535 (0 = any free port)")
        _check(
            self.root_path == "" or _root_path(self.root_path),
            "root_path",
            self.root_path,
            'must be "" or "/" followed by path segments, without a trailing "/", "?" or "#"',
        )
        _check(self.front in FRONTS, "front", self.front, f"must be one of {', '.join(FRONTS)}")
        _check_tls(self.tls_cert, self.tls_key)
        for origin in self.cors_origins:
            _check(_origin(origin), "cors_origins", origin, 'must be "*" or scheme://host[:port]')
        _check(
            self.workers == "auto" or (isinstance(self.workers, int) and 1 <= self.workers <= 512),
            "workers",
            self.workers,
            'must be 1..512 or "auto"',
        )
        _check(len(self.models) > 0, "models", self.models, "must list at least one model id")
        _check(
            not self.default_model or self.default_model in self.models,
            "default_model",
            self.default_model,
            f"must be one of [gateway].models {list(self.models)}",
        )
        _check(
            self.max_body_bytes >= 1024, "max_body_bytes", self.max_body_bytes, "must be >= 1024"
        )
        _positive("shutdown_timeout", self.shutdown_timeout)

    @property
    def front_chosen(self) -> str:
        """`front`, or $UNITGATE_FRONT when set (the test suite runs once with each)."""
        return env_choice(FRONT_ENV, self.front, "[gateway] front", FRONTS)

    @property
    def worker_count(self) -> int:
        """`workers` resolved: "auto" is the CPUs this process may run on."""
        if isinstance(self.workers, int):
            return self.workers
        return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1


def _root_path(value: str) -> bool:
    segments = value.split("/")
    return value.startswith("/") and all(segments[1:]) and not any(c in value for c in "?#%{} ")


def _origin(value: str) -> bool:
    """A browser's Origin value (scheme, host, optional port; no path), or "*"."""
    if value == "*":
        return True
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError:
        return False
    return (
        parts.scheme in ("http", "https")
        and bool(parts.hostname)
        and value == f"{parts.scheme}://{parts.netloc}"
    )


@dataclass(frozen=True, slots=True)
class TimeoutConfig:
    """Seconds. `first_byte` runs from sending the request to the first body byte of the answer."""

    connect: float = 2.0
    first_byte: float = 30.0
    idle: float = 30.0
    total: float = 600.0

    def __post_init__(self) -> None:
        for name in ("connect", "first_byte", "idle", "total"):
            _positive(name, getattr(self, name))


@dataclass(frozen=True, slots=True)
class UpstreamConfig:
    # 0 = unbounded. aiohttp's default of 100 silently queues requests beyond it.
    max_connections: int = 0
    keepalive_timeout: float = 30.0
    # Which relay streams answers: "native" (compiled, gateway/relay/native), "python" (the
    # reference), or "auto" (native when it builds). UNITGATE_RELAY overrides it.
    relay: str = "auto"

    def __post_init__(self) -> None:
        _check(self.max_connections >= 0, "max_connections", self.max_connections, "must be >= 0")
        _positive("keepalive_timeout", self.keepalive_timeout)
        _check(self.relay in RELAYS, "relay", self.relay, f"must be one of {', '.join(RELAYS)}")


AFFINITY_MODES = ("none", "session", "prefix", "session+prefix")
LATENCY_MODELS = ("route", "observe", "off")
PREFIX_SCORERS = ("auto", "approximate", "off")


@dataclass(frozen=True, slots=True)
class RoutingConfig:
    # session: `x-session-id` header or the `user` field; prefix: the first `prefix_chars` of
    # the prompt. Both map keys to units with bounded-load rendezvous hashing.
    affinity: str = "session+prefix"
    prefix_chars: int = 256
    # A unit takes an affine request only while its load <= factor x the fair share.
    bounded_load_factor: float = 1.25
    # A unit whose cache holds a request's whole prompt (by its KV events) takes it while its
    # load is at most this times the fair share; a partly cached prompt's bound lies between
    # the two by the share held (routing/cached.py). A hit saves a prefill a miss pays again
    # elsewhere, evicting other prefixes there. At or below bounded_load_factor: no effect.
    cached_load_factor: float = 2.0
    # Weigh each unit by this gateway's own requests plus the others' its leader reported in
    # the last probe round (other replicas'), not the own ones alone.
    engine_load: bool = True
    # Which unit holds which stored response (proxy/stored.py): at most this many ids, each
    # kept this long after its last use (about 200 bytes an id).
    stored_responses: int = 100_000
    stored_response_ttl: float = 86_400.0
    # Cached blocks the gateway's KV index keeps at most, over all units with `kv_events`
    # (RSS: about 440 bytes a block held by one unit, 170 more for each other unit holding it;
    # loadtest.bench.kv_costs), the least recently stored or matched first out.
    kv_index_blocks: int = 1_000_000
    # Where a prompt's prefix is cached: "auto" (from the units' KV events where a unit names
    # its publisher, `kv_events`, and a request's prompt ids are known; the approximate
    # prefix hash of `affinity` elsewhere), "approximate" (the hash alone), "off" (neither:
    # session affinity alone).
    prefix_scorer: str = "auto"
    # Each public model's Hugging Face folder (tokenizer.json and its chat template): the
    # gateway computes a request's prompt ids with it, as vLLM does, to find the units
    # holding its blocks. A model without one is routed by the approximate hash.
    tokenizers: dict[str, str] = field(default_factory=dict, hash=False)
    # For a model without a tokenizer: the prompt ids units reported for conversations' turns,
    # kept (at most this many tokens, 4 bytes each; 0 = none) so that a conversation's next
    # turn is routed by the blocks it starts with (gateway/kvevents/turns.py).
    conversation_tokens: int = 4_000_000
    # Each unit's time to first token and per output token, learned from its answers
    # (gateway/routing/latency.py): "route" sends a request to the unit predicted to answer
    # it soonest (where its prompt ids are known, or no affinity key applies) and flags a unit
    # whose prefill drifts far above the fleet's as slow; "observe" learns, exports and flags
    # without routing by it; "off" neither.
    # "observe" by default: routing by it trades a cache hit for a shorter queue without
    # counting the eviction that causes, which the prefix benchmark shows can cost hit rate
    # under KV pressure (docs/benchmarks.md).
    latency_model: str = "observe"

    def __post_init__(self) -> None:
        _check(
            self.latency_model in LATENCY_MODELS,
            "latency_model",
            self.latency_model,
            f"must be one of {LATENCY_MODELS}",
        )
        _check(
            self.conversation_tokens >= 0,
            "conversation_tokens",
            self.conversation_tokens,
            "must be >= 0",
        )
        _check(self.kv_index_blocks >= 1, "kv_index_blocks", self.kv_index_blocks, "must be >= 1")
        _check(
            self.prefix_scorer in PREFIX_SCORERS,
            "prefix_scorer",
            self.prefix_scorer,
            f"must be one of {PREFIX_SCORERS}",
        )
        for model, folder in self.tokenizers.items():
            _check(
                isinstance(folder, str) and (Path(folder) / "tokenizer.json").is_file(),
                "tokenizers",
                f"{model} = {folder!r}",
                "must name a folder holding tokenizer.json (the model's Hugging Face folder)",
            )
        if self.tokenizers:
            installed("tokenizers", sorted(self.tokenizers), ("tokenizers", "jinja2"), "kv")
        _check(
            self.stored_responses >= 0, "stored_responses", self.stored_responses, "must be >= 0"
        )
        _check(
            self.stored_response_ttl > 0,
            "stored_response_ttl",
            self.stored_response_ttl,
            "must be > 0",
        )
        _check(
            self.affinity in AFFINITY_MODES,
            "affinity",
            self.affinity,
            f"must be one of {AFFINITY_MODES}",
        )
        _check(self.prefix_chars >= 1, "prefix_chars", self.prefix_chars, "must be >= 1")
        _check(
            self.bounded_load_factor >= 1.0,
            "bounded_load_factor",
            self.bounded_load_factor,
            "must be >= 1.0",
        )
        _check(
            self.cached_load_factor >= 1.0,
            "cached_load_factor",
            self.cached_load_factor,
            "must be >= 1.0",
        )


@dataclass(frozen=True, slots=True)
class RetryConfig:
    # Attempts per request, the first included; each retry goes to a unit not yet tried.
    max_attempts: int = 3
    # Retries may add at most this share of recent requests, plus `budget_min_per_second`.
    budget_ratio: float = 0.2
    budget_min_per_second: float = 1.0
    budget_window: float = 10.0

    def __post_init__(self) -> None:
        _check(self.max_attempts >= 1, "max_attempts", self.max_attempts, "must be >= 1")
        _check(0.0 <= self.budget_ratio <= 1.0, "budget_ratio", self.budget_ratio, "must be 0..1")
        _check(
            self.budget_min_per_second >= 0,
            "budget_min_per_second",
            self.budget_min_per_second,
            "must be >= 0",
        )
        _check(
            1.0 <= self.budget_window <= 600.0,
            "budget_window",
            self.budget_window,
            "must be 1..600 s",
        )


@dataclass(frozen=True, slots=True)
class ResumeConfig:
    # Continue a stream that broke after its first byte on another unit, token-exactly
    # (the units must return token ids, as vLLM and the builtin engine do).
    enabled: bool = True
    # Continuations per stream; each is also paid from the retry budget.
    max_resumes: int = 2
    # Once its probes eject a unit, a stream on it that has been this many seconds without
    # data is resumed elsewhere at once (instead of at [timeouts].idle); one still receiving
    # tokens runs on.
    ejected_idle: float = 1.0

    def __post_init__(self) -> None:
        _check(self.max_resumes >= 0, "max_resumes", self.max_resumes, "must be >= 0")
        _positive("ejected_idle", self.ejected_idle)


@dataclass(frozen=True, slots=True)
class AdmissionConfig:
    # Per-unit in-flight cap for units that do not set `max_inflight`.
    unit_max_inflight: int = 256
    # Requests that find every unit full wait here, FIFO, for at most `queue_timeout`.
    queue_size: int = 1024
    queue_timeout: float = 5.0
    # Seconds advertised in `Retry-After` on 429 and 503.
    retry_after: int = 1
    # Requests in flight through this gateway at once, over all units. Each holds two open
    # files (the client's connection and the unit's); 0 = what the open-files limit allows,
    # so a burst waits in the queue instead of failing connects with EMFILE.
    max_inflight: int = 0

    def __post_init__(self) -> None:
        _check(
            self.unit_max_inflight >= 1, "unit_max_inflight", self.unit_max_inflight, "must be >= 1"
        )
        _check(self.max_inflight >= 0, "max_inflight", self.max_inflight, "must be >= 0")
        _check(self.queue_size >= 0, "queue_size", self.queue_size, "must be >= 0")
        _check(self.queue_timeout >= 0, "queue_timeout", self.queue_timeout, "must be >= 0")
        _check(self.retry_after >= 0, "retry_after", self.retry_after, "must be >= 0")
