"""The follower loop: receive the leader's step message, run the same forward pass, repeat.

A follower holds a shard of every layer, so it must take part in every forward pass or the
leader's all-reduces stall. It needs no scheduler and no sampler: the batch arrives complete,
with the block table edits to make before the forward and the block copies (forks) after.
"""

from __future__ import annotations

import logging

from engine.runtime.group import first_line
from engine.runtime.health import NodeStats
from engine.runtime.messages import Command, Receive, StepMessage, receive
from engine.runtime.stepper import StepModel

log = logging.getLogger(__name__)


def run_follower(model: StepModel, stats: NodeStats, receive_step: Receive = receive) -> int:
    """Loop until STOP (exit code 0) or until the leader is lost (exit code 1).

    Losing the leader shows as a broadcast that raises: the connection closed (the leader
    died) or Gloo's collective timeout passed (it hung or the network broke). The follower
    cannot recover its place in the group, so it exits and leaves restarts to a supervisor.
    `receive_step` is the broadcast every step message comes from (a benchmark wraps it).
    """
    rank, group = model.tp.rank, model.tp.group
    while True:
        try:
            msg = receive_step(group)
        except Exception as exc:
            reason = f"lost the leader: {first_line(exc)}"
            stats.mark_unhealthy(reason)
            log.error("follower rank %d: %s; exiting", rank, reason)
            return 1
        if msg.command is Command.STOP:
            log.info("follower rank %d: leader sent STOP; exiting", rank)
            return 0
        stats.set_load(msg.pending, msg.slots_used)
        if msg.command is Command.STEP and not _run_step(model, msg, stats, rank):
            return 1
        if msg.command is Command.STEP:
            stats.record_step(msg.pending, msg.slots_used)


def _run_step(model: StepModel, msg: StepMessage, stats: NodeStats, rank: int) -> bool:
    try:
        with model.cache.stepping(msg.tables, msg.forks):
            model(msg.entries)
    except Exception as exc:
        reason = f"forward failed: {first_line(exc)}"
        stats.mark_unhealthy(reason)
        log.error("follower rank %d: %s; exiting", rank, reason)
        return False
    return True
