"""The replicas' ports, checked before anything starts.

A child replica that cannot bind would fail in a log file after the units had started
loading; checked here, `up` refuses at once and names the replica, the listener and the port.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.api import Config
from gateway.base.ports import is_free
from gateway.launcher.up.fleet import ReplicaPorts
from gateway.launcher.up.plan import PlanError


def check_free(config: Config, replicas: Sequence[ReplicaPorts]) -> None:
    """PlanError for the first replica listener whose port another process holds now."""
    for replica in replicas:
        listeners = (
            ("public", config.gateway.host, replica.public, "[gateway].port"),
            ("operator (metrics, admin)", config.metrics.host, replica.metrics, "[metrics].port"),
        )
        for what, host, port, key in listeners:
            if port and not is_free(host, port):
                raise PlanError(
                    f"replica {replica.index}'s {what} port {host}:{port} is taken by another "
                    f"process; free it or move {key} (replica i listens above replica i-1)"
                )
