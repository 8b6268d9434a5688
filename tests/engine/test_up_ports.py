"""Ports planned for children: a unit planned one port at a time must never get two nodes on
one address."""

from __future__ import annotations

import socket

from gateway.base.ports import LOWEST, ephemeral_range, free_port, free_ports, planned_ranges


def test_no_port_is_handed_out_twice() -> None:
    # The OS alone repeats a just-closed port: 7-12 repeats in 500 calls were seen here.
    ports = [free_port() for _ in range(500)] + free_ports(500)
    assert len(set(ports)) == len(ports)


def test_a_planned_port_is_free_to_bind() -> None:
    (port,) = free_ports(1)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_planned_ports_are_outside_the_ephemeral_range() -> None:
    """Outgoing connections and binds to port 0 (Gloo, vLLM's own sockets) take their ports
    from the ephemeral range: one took a planned rendezvous port before its store bound it."""
    ephemeral = ephemeral_range()
    assert ephemeral is not None  # Linux: CI's machine
    lo, hi = ephemeral
    ports = free_ports(300)
    assert all(LOWEST <= p < lo or p > hi for p in ports)
    with socket.socket() as held:  # what the OS hands out for port 0 is never planned
        held.bind(("127.0.0.1", 0))
        assert lo <= held.getsockname()[1] <= hi


def test_the_ranges_leave_out_the_ephemeral_one() -> None:
    assert planned_ranges((32768, 60999)) == [range(LOWEST, 32768), range(61000, 65536)]
    assert planned_ranges((1024, 65535)) == []
    assert planned_ranges(None) == [range(LOWEST, 65536)]
    assert planned_ranges((5000, 20000)) == [range(20001, 65536)]
