"""The multi-node unit runtime: a leader that schedules and samples, followers that mirror its
forward passes, and a step message over Gloo that keeps them in lockstep (broadcast under
tensor parallelism, sent to each follower on a pipeline: `unicast`, `pipelined`)."""

from engine.runtime.group import destroy_unit_group, init_unit_group
from engine.runtime.health import NodeStats, serve_health
from engine.runtime.leader import LeaderEngine
from engine.runtime.messages import Command, StepMessage, decode, encode, receive, send
from engine.sampling import sample

__all__ = [
    "Command",
    "LeaderEngine",
    "NodeStats",
    "StepMessage",
    "decode",
    "destroy_unit_group",
    "encode",
    "init_unit_group",
    "receive",
    "sample",
    "send",
    "serve_health",
]
