"""The ids the gateway gives requests that came without a usable x-request-id of their own."""

from __future__ import annotations

import os
import re

from gateway.proxy.intake import _RequestIds, request_id

HEX24 = re.compile(r"[0-9a-f]{24}")


def test_new_ids_are_24_hex_digits_and_never_repeat() -> None:
    ids = [request_id({}) for _ in range(50_000)]
    assert all(HEX24.fullmatch(i) for i in ids)
    assert len(set(ids)) == len(ids)


def test_a_sane_client_id_is_kept_and_anything_else_replaced() -> None:
    assert request_id({"x-request-id": "trace-7:a.b_c"}) == "trace-7:a.b_c"
    for bad in ("", "has space", "x" * 129, "nul\x00", "ünï"):
        assert HEX24.fullmatch(request_id({"x-request-id": bad})), bad


def test_two_processes_never_share_their_ids() -> None:
    """Each process (a worker, a replica) draws its own random half; a forked child too."""
    assert _RequestIds()()[:12] != _RequestIds()()[:12]
    ids = _RequestIds()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next ids, then out without pytest's clean-up
        os.write(write, " ".join(ids() for _ in range(3)).encode())
        os._exit(0)
    os.close(write)
    _, status = os.waitpid(pid, 0)
    child = os.read(read, 4096).decode().split()
    os.close(read)
    assert status == 0
    mine = [ids() for _ in range(3)]
    assert len(child) == 3
    assert {i[:12] for i in child}.isdisjoint({i[:12] for i in mine})
