"""Config units -> the node processes `unitgate up` runs on this machine, or (`--simulated`)
the nodes the simulator serves.

Pure: nothing is bound or spawned, so the mapping from URLs to flags is tested without
processes. The master (rendezvous) port is not in the plan: a unit gets a fresh one at every
(re)start, so a restarted group never races the old group's listening socket.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from urllib.parse import urlsplit

from engine.backends.vllm.args import check_keys
from gateway.api import Config, UnitConfig, is_loopback
from gateway.base.net import http_address


class PlanError(ValueError):
    """A unit `unitgate up` cannot run locally; the message names the unit and the URL."""


@dataclass(frozen=True, slots=True)
class EngineOptions:
    """Flags every node of every local unit shares: the demo's seeded tiny model."""

    model: str = "tiny"
    seed: int = 0
    threads: int = 1  # a few nodes share a laptop's cores; oversubscribing slows every step
    num_slots: int = 8
    collective_timeout: float = 10.0
    connect_timeout: float = 60.0


@dataclass(frozen=True, slots=True)
class NodeSpec:
    unit: str
    rank: int
    world_size: int
    host: str
    port: int  # leader: the OpenAI API (and /health); follower: /health
    served_model: str
    backend: str = "builtin"
    model: str = ""  # "" = EngineOptions.model
    engine_args: str = "{}"  # vllm: the unit's engine_args as JSON
    health_port: int | None = None  # leader: /health from a thread; None: on the API port
    max_seq_len: int | None = None  # builtin: KV positions per sequence; None: the model's
    weight_dtype: str | None = None  # builtin: how the matrices are stored; None: float32
    prefill_chunk: int | None = None  # builtin: prompt tokens per step; None: the engine's
    pp: int = 1  # builtin: pipeline stages (the nodes form tp x pp)
    kv_events: str = ""  # builtin leader: where it publishes its KV events ("" none)
    kv_events_replay: str = ""

    @property
    def role(self) -> str:
        return "leader" if self.rank == 0 else "follower"

    @property
    def ports(self) -> tuple[int, ...]:
        return (self.port,) if self.health_port is None else (self.port, self.health_port)

    @property
    def health_url(self) -> str:
        """Where the gateway probes this node: its entry in the unit's `nodes`."""
        port = self.port if self.health_port is None else self.health_port
        host = f"[{self.host}]" if ":" in self.host else self.host  # an IPv6 address
        return f"http://{host}:{port}/health"

    def argv(self, master: str, options: EngineOptions) -> list[str]:
        """The node's flags (`python -m engine`, `unitgate node`) for this node in a group
        rendezvousing at `master`."""
        where = ("--host", "--port") if self.rank == 0 else ("--health-host", "--health-port")
        args = [
            *("--role", self.role, "--unit", self.unit, "--rank", str(self.rank)),
            *("--world-size", str(self.world_size), "--master", master),
            *(where[0], self.host, where[1], str(self.port)),
            *("--model", self.model or options.model, "--seed", str(options.seed)),
            *("--threads", str(options.threads), "--num-slots", str(options.num_slots)),
            *("--collective-timeout", str(options.collective_timeout)),
            *("--connect-timeout", str(options.connect_timeout)),
        ]
        if self.rank == 0:
            args += ["--served-model-name", self.served_model]
        if self.rank == 0 and self.health_port is not None:
            args += ["--health-host", self.host, "--health-port", str(self.health_port)]
        if self.max_seq_len is not None:
            args += ["--max-seq-len", str(self.max_seq_len)]
        if self.weight_dtype is not None:
            args += ["--weight-dtype", self.weight_dtype]
        if self.prefill_chunk is not None:
            args += ["--prefill-chunk", str(self.prefill_chunk)]
        if self.pp != 1:
            args += ["--pp", str(self.pp)]
        if self.kv_events:
            args += ["--kv-events", self.kv_events]
        if self.kv_events_replay:
            args += ["--kv-events-replay", self.kv_events_replay]
        if self.backend != "builtin":
            args += ["--backend", self.backend, "--vllm-args", self.engine_args]
        return args


@dataclass(frozen=True, slots=True)
class UnitPlan:
    unit: str
    nodes: tuple[NodeSpec, ...]
    # Whether `ready` waits until the gateway routes to it: every unit `up` runs, but for a
    # simulated unit the gateway probes as another kind (plan_simulated).
    awaited: bool = True

    @property
    def leader(self) -> NodeSpec:
        return self.nodes[0]


@dataclass(frozen=True, slots=True)
class Plan:
    units: tuple[UnitPlan, ...]
    skipped: tuple[str, ...]  # not on loopback, or stock servers: someone else runs them

    @property
    def awaited(self) -> tuple[UnitPlan, ...]:
        """The units `ready` waits for: the gateway routes to each, every node says ok."""
        return tuple(u for u in self.units if u.awaited)


def plan_units(config: Config) -> Plan:
    """Every unit of this project's kind whose node URLs are all on loopback becomes a local
    unit; the rest (other kinds: stock servers) are left to whoever runs them (the gateway
    still routes to them)."""
    units: list[UnitPlan] = []
    skipped: list[str] = []
    for unit in config.units:
        if unit.kind != "unitgate":  # a stock server: its own operator runs it
            skipped.append(unit.id)
            continue
        local = [is_loopback(_host(unit, url)) for url in unit.nodes]
        if not any(local):
            skipped.append(unit.id)
            continue
        if not all(local):
            raise PlanError(f"unit {unit.id}: some nodes are on loopback, some not: {unit.nodes}")
        units.append(plan_unit(unit, _served_model(config, unit)))
    _check_ports_unique(units)
    return Plan(tuple(units), tuple(skipped))


def plan_simulated(config: Config) -> Plan:
    """`unitgate up --simulated`: every unit of the config, of any kind and wherever its URLs
    point, is served by the simulator at its own addresses, as the config loaded them (what
    `unitgate sim --from-config` accepts; an address not of this machine fails its bind).
    `ready` waits for the units of this project's kind: the simulator answers as this
    project's nodes do, so a unit the gateway probes as a stock server (`kind = "openai"`
    looks for its model in /v1/models) is served but need not become routable."""
    seen: dict[tuple[str, int], str] = {}
    units = []
    for unit in config.units:
        units.append(_simulated_unit(unit, _served_model(config, unit)))
        listeners = [(url, f"unit {unit.id} nodes[{r}]") for r, url in enumerate(unit.nodes)]
        if _sim_address(unit, unit.leader) != _sim_address(unit, unit.nodes[0]):
            listeners.append((unit.leader, f"unit {unit.id} leader"))
        for url, who in listeners:
            other = seen.setdefault(_sim_address(unit, url), who)
            if other != who:
                raise PlanError(f"{url}: given to two simulated listeners, {other} and {who}")
    return Plan(tuple(units), ())


def _simulated_unit(unit: UnitConfig, served_model: str) -> UnitPlan:
    """Rank 0's spec: /health on nodes[0]'s host and port, the API on the leader's port
    (`ports` lists both, so replicas are laid out around them)."""
    leader = _sim_address(unit, unit.leader)
    specs = []
    for rank, url in enumerate(unit.nodes):
        host, port = _sim_address(unit, url)
        health = None
        if rank == 0 and (host, port) != leader:
            health, port = port, leader[1]
        specs.append(
            NodeSpec(unit.id, rank, len(unit.nodes), host, port, served_model, health_port=health)
        )
    return UnitPlan(unit.id, tuple(specs), awaited=unit.kind == "unitgate")


def _sim_address(unit: UnitConfig, url: str) -> tuple[str, int]:
    """The simulator's own rule (gateway/base/net.http_address), checked before it starts."""
    try:
        host, port = http_address(url)
    except ValueError:
        host, port = "", None
    if not port:
        raise PlanError(
            f"unit {unit.id}: a simulated node is served at http://HOST:PORT (plain HTTP, "
            f"a port other than 0), got {url!r}"
        )
    return host, port


def plan_unit(unit: UnitConfig, served_model: str) -> UnitPlan:
    world = len(unit.nodes)
    engine_args = _engine_args(unit)
    specs = tuple(
        NodeSpec(
            unit.id,
            rank,
            world,
            _host(unit, url),
            _port(unit, unit.leader if rank == 0 else url),
            served_model,
            unit.backend,
            unit.model,
            engine_args,
            _leader_health_port(unit) if rank == 0 else None,
            unit.max_seq_len,
            unit.weight_dtype,
            unit.prefill_chunk,
            unit.pp,
            *_publishes(unit, rank),
        )
        for rank, url in enumerate(unit.nodes)
    )
    return UnitPlan(unit.id, specs)


def _publishes(unit: UnitConfig, rank: int) -> tuple[str, str]:
    """A builtin unit's leader binds the publisher the gateway reads (`kv_events`); a vLLM
    unit's engine_args say where vLLM publishes (kv_events.py)."""
    if rank != 0 or unit.backend != "builtin":
        return "", ""
    return unit.kv_events, unit.kv_events_replay


def _leader_health_port(unit: UnitConfig) -> int | None:
    """nodes[0] is where rank 0 answers /health: the leader URL itself (the API's /health), or
    another port of the leader's host (a thread listener that does not queue behind streams)."""
    health = unit.nodes[0].rstrip("/")
    if health == unit.leader:
        return None
    if _host(unit, health) != _host(unit, unit.leader):
        raise PlanError(
            f"unit {unit.id}: nodes[0] (rank 0's /health) must be the leader URL "
            f"{unit.leader!r} or another port on its host, got {unit.nodes[0]!r}"
        )
    port = _port(unit, health)
    return None if port == _port(unit, unit.leader) else port


def _engine_args(unit: UnitConfig) -> str:
    """The unit's engine_args as the nodes' --vllm-args, minus what the plan itself decides."""
    try:
        check_keys(unit.engine_args, f"unit {unit.id}: engine_args")
        return json.dumps(unit.engine_args, sort_keys=True)
    except (ValueError, TypeError) as exc:
        raise PlanError(str(exc)) from None


def _served_model(config: Config, unit: UnitConfig) -> str:
    """The id the gateway routes this unit by: the leader must accept it as its model."""
    return (unit.models or config.gateway.models)[0]


def _host(unit: UnitConfig, url: str) -> str:
    host = urlsplit(url).hostname
    if not host:
        raise PlanError(f"unit {unit.id}: no host in {url!r}")
    return host


def _port(unit: UnitConfig, url: str) -> int:
    parts = urlsplit(url)
    if parts.scheme != "http" or parts.path not in ("", "/") or not parts.port:
        raise PlanError(f"unit {unit.id}: a local node URL must be http://HOST:PORT, got {url!r}")
    return parts.port


def _check_ports_unique(units: list[UnitPlan]) -> None:
    seen: dict[int, str] = {}
    for spec in (node for unit in units for node in unit.nodes):
        who = f"{spec.unit} rank {spec.rank}"
        for port in spec.ports:
            other = seen.setdefault(port, who)
            if other != who:
                raise PlanError(f"port {port}: used by {other} and {who}")
