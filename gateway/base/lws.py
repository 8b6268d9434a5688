"""A node's place in its unit, read from what Kubernetes' LeaderWorkerSet injects.

LeaderWorkerSet runs a unit as one group of pods and gives every container three variables:
`LWS_LEADER_ADDRESS` (the leader pod's DNS name through the group's headless service),
`LWS_GROUP_SIZE` (pods in the group: the world size) and `LWS_WORKER_INDEX` (0 for the leader,
1..size-1 for the workers: the rank). `unitgate node --from-env lws` turns them into --rank,
--world-size and --master (the leader's address plus --master-port), so a pod template needs
no wrapper script, and one template serves every worker of every group.

A flag given as well must agree with the environment: two sources of one rank that differ
would otherwise show up only as a rendezvous that never completes. Pure (the environment is
an argument), so the checks are tested without a cluster.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

LEADER_ADDRESS = "LWS_LEADER_ADDRESS"
GROUP_SIZE = "LWS_GROUP_SIZE"
WORKER_INDEX = "LWS_WORKER_INDEX"
# torch.distributed's customary MASTER_PORT, and NodeSettings' own default rendezvous port.
DEFAULT_MASTER_PORT = 29500
SOURCES = ("lws",)  # the values --from-env takes


@dataclass(frozen=True, slots=True)
class Placement:
    """Where LWS put this pod: its group's leader, the group's size, its own index."""

    leader_address: str
    world_size: int
    rank: int

    @property
    def role(self) -> str:
        return "leader" if self.rank == 0 else "follower"

    def master(self, port: int) -> str:
        """HOST:PORT of the leader's rendezvous store (an IPv6 literal in brackets)."""
        host = self.leader_address
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def read(env: Mapping[str, str]) -> Placement:
    """The three variables, checked; a ValueError names the variable and its bad value."""
    address = _required(env, LEADER_ADDRESS)
    _check_address(address)
    size = _integer(env, GROUP_SIZE, minimum=1)
    index = _integer(env, WORKER_INDEX, minimum=0)
    if index >= size:
        raise ValueError(
            f"{WORKER_INDEX}: must be below {GROUP_SIZE} ({size}), got {env[WORKER_INDEX]!r}"
        )
    return Placement(address, size, index)


def resolve(
    placement: Placement, given: Mapping[str, Any], master_port: int | None
) -> dict[str, Any]:
    """NodeSettings values for role, rank, world_size and master from the placement.

    `given` holds the flags the command line set explicitly (by NodeSettings field name);
    each must equal what the environment says, and the error names both.
    """
    port = DEFAULT_MASTER_PORT if master_port is None else master_port
    if not 1 <= port <= 65535:
        raise ValueError(f"--master-port: must be 1..65535, got {port}")
    values = {
        "role": placement.role,
        "rank": placement.rank,
        "world_size": placement.world_size,
        "master": placement.master(port),
    }
    sources = {
        "role": f"{WORKER_INDEX}={placement.rank}, which makes this node the {placement.role}",
        "rank": f"{WORKER_INDEX}={placement.rank}",
        "world_size": f"{GROUP_SIZE}={placement.world_size}",
        "master": f"{LEADER_ADDRESS}={placement.leader_address} with --master-port {port}",
    }
    for name, value in values.items():
        if name in given and given[name] != value:
            flag = "--" + name.replace("_", "-")
            raise ValueError(
                f"{flag} {given[name]} conflicts with {sources[name]} (--from-env lws); "
                f"drop {flag} or make them agree"
            )
    return values


def _required(env: Mapping[str, str], name: str) -> str:
    value = env.get(name)
    if value is None:
        raise ValueError(
            f"{name}: not set (--from-env lws reads it from what LeaderWorkerSet injects "
            "into each pod of a group)"
        )
    return value


def _integer(env: Mapping[str, str], name: str, minimum: int) -> int:
    text = _required(env, name)
    if not re.fullmatch(r"[0-9]+", text.strip()) or int(text) < minimum:
        raise ValueError(f"{name}: expected an integer >= {minimum}, got {text!r}")
    return int(text)


def _check_address(address: str) -> None:
    """A host name or IP address, nothing more: a port or a URL here would be doubled up."""
    bad = not address or any(c.isspace() or c in "/@" for c in address)
    if not bad and ":" in address:
        try:
            bad = ipaddress.ip_address(address).version != 6
        except ValueError:
            bad = True
    if bad:
        raise ValueError(f"{LEADER_ADDRESS}: expected a host name or IP address, got {address!r}")
