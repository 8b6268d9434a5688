"""The unit's process group: every node of a unit is one rank of one Gloo world (the TP group;
with pipeline stages, each stage's ranks also form a group of their own, see `stage_group`).

The rendezvous store gets its own, long timeout (a leader may load a big checkpoint while its
followers wait); the collectives get a short one, because a collective that outlives it means a
peer died or hung and the unit must fail fast instead of hanging every request.
"""

from __future__ import annotations

import logging
from datetime import timedelta

import torch.distributed as dist

from engine.model import TPContext
from engine.model.stages import Layout

log = logging.getLogger(__name__)


def parse_master(master: str) -> tuple[str, int]:
    """'host:port' -> (host, port); the error names the flag and the bad value."""
    host, sep, port = master.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"master: expected 'host:port', got {master!r}")
    return host.strip("[]"), int(port)


def init_unit_group(
    rank: int,
    world_size: int,
    master: str,
    timeout: float = 10.0,
    connect_timeout: float = 300.0,
) -> TPContext:
    """Join the unit's Gloo world; rank 0 (the leader) hosts the rendezvous store at `master`.

    `timeout` bounds every collective (Gloo raises when it passes); `connect_timeout` bounds
    the wait for all ranks to arrive. World size 1 needs no group at all.
    """
    ctx = TPContext(rank=rank, world_size=world_size)  # validates rank and world size
    if world_size == 1:
        return ctx
    host, port = parse_master(master)
    store = dist.TCPStore(  # type: ignore[attr-defined]
        host,
        port,
        world_size,
        is_master=rank == 0,
        timeout=timedelta(seconds=connect_timeout),
    )
    dist.init_process_group(
        backend="gloo",
        store=store,
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=timeout),
    )
    log.info("rank %d/%d joined the unit group at %s", rank, world_size, master)
    return TPContext.from_process_group()


def stage_group(layout: Layout) -> TPContext:
    """This rank's stage as a tensor-parallel context. Every rank creates every stage's
    group, in stage order (torch.distributed requires all ranks to take part in each);
    a stage of one rank needs none. Call after `init_unit_group`."""
    if layout.tp == 1:
        return TPContext()
    groups = [dist.new_group(layout.stage_ranks(s)) for s in range(layout.pp)]
    return TPContext(layout.tp_rank, layout.tp, groups[layout.stage])


def destroy_unit_group() -> None:
    """Idempotent, so every owner can call it on its way out without coordinating."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def first_line(exc: BaseException) -> str:
    """Gloo errors carry multi-line C++ traces; one clear log line is what operators need."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else '(no message)'}"
