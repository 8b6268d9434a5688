"""Ports: are the replicas' free before anything starts, and which to tell a child to bind.

A child replica that cannot bind would fail in a log file after the units had started
loading; checked here, `up` refuses at once and names the replica, the listener and the port.
The bind sets SO_REUSEADDR as the gateway's own listeners do, so a port left in TIME_WAIT by
the last run counts as free, as it is for them.

A port for a child (a unit's rendezvous store, a test's node) is one the OS hands out free
now. Closed again, the same number can come back on the next call, so two units started
together could be told one store port (CI saw the like: a test's follower planned on its
leader's port). `free_port` therefore never repeats one of the last `_REMEMBERED` it gave.
"""

from __future__ import annotations

import socket
import threading
from collections import deque
from collections.abc import Sequence

from engine.up.fleet import ReplicaPorts
from engine.up.plan import PlanError
from gateway.api import Config

_REMEMBERED = 4096  # a fraction of the ephemeral range, more than a test session plans
_ATTEMPTS = 1000
_recent: deque[int] = deque(maxlen=_REMEMBERED)
_recent_set: set[int] = set()
_lock = threading.Lock()  # test harnesses plan ports from threads too


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


def free_port(host: str = "127.0.0.1") -> int:
    """A port free now on `host` that none of the last `_REMEMBERED` calls returned."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with _lock:
        for _ in range(_ATTEMPTS):
            with socket.socket(family) as sock:
                sock.bind((host, 0))
                port: int = sock.getsockname()[1]
            if port not in _recent_set:
                if len(_recent) == _REMEMBERED:
                    _recent_set.discard(_recent[0])
                _recent.append(port)
                _recent_set.add(port)
                return port
    raise RuntimeError(f"no port on {host} that was not just handed out, in {_ATTEMPTS} tries")


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """`n` distinct ports, each free now on `host` and not handed out lately."""
    return [free_port(host) for _ in range(n)]
