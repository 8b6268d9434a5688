"""`unitgate up --replicas N`: where each gateway replica listens and what config it runs.

Pure, like plan.py: nothing is bound or spawned, so the port layout and the state override are
tested without processes. The parent computes replica 0's config here and every child
replica computes its own from the same file and the same function, so they cannot disagree.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from gateway.api import Config
from gateway.launcher.up.plan import Plan, PlanError

MAX_PORT = 65535


@dataclass(frozen=True, slots=True)
class ReplicaPorts:
    """One replica's two listeners: the public API and the operator one (metrics, admin)."""

    index: int
    public: int
    metrics: int


def replica_ports(config: Config, plan: Plan, count: int) -> tuple[ReplicaPorts, ...]:
    """Replica 0 on the config's ports; replica i on the next port above replica i-1's that no
    other listener of this run holds (a unit's node, another replica). So the default 8080
    and 8081 give replica 1 8082 and 8083, where "port + 1" would give it 8081 twice. A port
    of 0 stays 0: every replica then gets its own port from the OS."""
    if count < 1:
        raise PlanError(f"--replicas must be >= 1, got {count}")
    first = ReplicaPorts(0, config.gateway.port, config.metrics.port)
    used = {port for unit in plan.units for node in unit.nodes for port in node.ports}
    used |= {first.public, first.metrics} - {0}
    ports = [first]
    for index in range(1, count):
        public = _next_port(ports[-1].public, used, index, "[gateway].port")
        used.add(public)
        metrics = _next_port(ports[-1].metrics, used, index, "[metrics].port")
        used.add(metrics)
        ports.append(ReplicaPorts(index, public, metrics))
    return tuple(ports)


def _next_port(after: int, used: set[int], index: int, key: str) -> int:
    if after == 0:
        return 0
    port = after + 1
    while port in used:
        port += 1
    if port > MAX_PORT:
        raise PlanError(f"replica {index}: no port left above {key} for it (past {MAX_PORT})")
    return port


def runs_store(config: Config, replicas: int) -> bool:
    """Whether `up` starts a redis-server of its own: for more than one replica, when there is
    admin state to share (the admin API is on) and the config names no shared store. A
    config's own `[state] backend = "redis"` is the operator's choice and is used as it is."""
    return replicas > 1 and config.admin.enabled and config.state.backend != "redis"


def replica_config(config: Config, ports: ReplicaPorts, store_url: str | None) -> Config:
    """The config replica `ports.index` runs: its listeners, and with `store_url` (the
    redis-server `up` started) the state shared through it. That server listens only on a
    Unix socket only this user may open, so no credentials are sent: the config's username,
    password and TLS settings are for its own store, not this one. A replica name set in the
    config gets the index appended, or every replica would report under one name."""
    state = config.state
    if store_url is not None:
        state = replace(
            state,
            backend="redis",
            url=store_url,
            username="",
            password_env="",
            password_file="",
            tls_ca_file="",
        )
    if state.replica:
        state = replace(state, replica=f"{state.replica}-{ports.index}")
    return replace(
        config,
        gateway=replace(config.gateway, port=ports.public),
        metrics=replace(config.metrics, port=ports.metrics),
        state=state,
    )
