"""Are the replicas' ports free, before anything starts?

A child replica that cannot bind would fail in a log file after the units had started
loading; checked here, `up` refuses at once and names the replica, the listener and the port.
The bind sets SO_REUSEADDR as the gateway's own listeners do, so a port left in TIME_WAIT by
the last run counts as free, as it is for them.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence

from engine.up.fleet import ReplicaPorts
from engine.up.plan import PlanError
from gateway.api import Config


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


def is_free(host: str, port: int) -> bool:
    """Can every address `host` resolves to bind `port` now (as the gateway would)?"""
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror:
        return True  # not ours to judge: the gateway's own bind reports a bad host
    for family, kind, proto, _, address in addresses:
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(address)
            except OSError:
                return False
    return True
