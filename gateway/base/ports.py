"""Ports: is one free now (`is_free`), and which to tell a child to bind (`free_port`).

`is_free` binds with SO_REUSEADDR as the gateway's own listeners do, so a port left in
TIME_WAIT by the last run counts as free, as it is for them.

A port for a child (a unit's rendezvous store, a test's node) is one free now, which the
child binds seconds later (a vLLM leader binds its rendezvous store after loading the model).
So it is drawn outside the kernel's ephemeral range (net.ipv4.ip_local_port_range): every
outgoing connection and every bind to port 0 (Gloo's pairs, vLLM's own sockets, the OS's
choice for any listener) takes its port from that range, and one did take a planned store
port in CI (EADDRINUSE at the rendezvous). And a port handed out and not yet bound is free
again, so two units started together could be told one store port (CI saw that too: a test's
follower planned on its leader's port): `free_port` never repeats one of the last
`_REMEMBERED` it gave.
"""

from __future__ import annotations

import random
import socket
import threading
from collections import deque
from pathlib import Path

_REMEMBERED = 4096  # a fraction of the ephemeral range, more than a test session plans
_ATTEMPTS = 1000
_recent: deque[int] = deque(maxlen=_REMEMBERED)
_recent_set: set[int] = set()
_lock = threading.Lock()  # test harnesses plan ports from threads too
_random = random.SystemRandom()  # processes planning at once draw apart
LOWEST = 10_000  # below: ports services are known to listen on by default (redis, postgres)
EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")


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


def planned_ranges(ephemeral: tuple[int, int] | None) -> list[range]:
    """The ports `free_port` draws from: from LOWEST up, less the ephemeral range (`lo`, `hi`,
    inclusive); everything from LOWEST up when that range is not known."""
    if ephemeral is None:
        return [range(LOWEST, 65536)]
    lo, hi = ephemeral
    return [r for r in (range(LOWEST, min(lo, 65536)), range(max(hi + 1, LOWEST), 65536)) if r]


def ephemeral_range() -> tuple[int, int] | None:
    """The kernel's ephemeral port range, or None off Linux or when unreadable."""
    try:
        lo, hi = (int(v) for v in EPHEMERAL.read_text().split())
    except (OSError, ValueError):
        return None
    return lo, hi


def free_port(host: str = "127.0.0.1") -> int:
    """A port free now on `host`, outside the ephemeral range (where nothing else is handed
    it before its child binds it), that none of the last `_REMEMBERED` calls returned."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    ranges = planned_ranges(ephemeral_range())
    sizes = [len(r) for r in ranges]
    with _lock:
        for _ in range(_ATTEMPTS):
            # With the ephemeral range all there is, the OS's choice (port 0).
            port = _random.choice(_random.choices(ranges, weights=sizes)[0]) if ranges else 0
            with socket.socket(family) as sock:
                try:
                    sock.bind((host, port))  # no SO_REUSEADDR: a port in TIME_WAIT is passed over
                except OSError:
                    continue
                port = int(sock.getsockname()[1])
            if port in _recent_set:
                continue
            if len(_recent) == _REMEMBERED:
                _recent_set.discard(_recent[0])
            _recent.append(port)
            _recent_set.add(port)
            return port
    raise RuntimeError(f"no free port on {host} not handed out lately, in {_ATTEMPTS} tries")


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """`n` distinct ports, each free now on `host` and not handed out lately."""
    return [free_port(host) for _ in range(n)]
