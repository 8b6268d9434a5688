"""Which node of which unit the watched process is: from --unit and --rank, or from what a
LeaderWorkerSet injects (`--from-env lws`, read by `engine.lws`, the module `unitgate node
--from-env lws` reads it with; it imports nothing beyond the standard library).

Under LWS the rank is LWS_WORKER_INDEX, and the unit defaults to the leader pod's name, the
first label of LWS_LEADER_ADDRESS (`<lws>-<group>.<lws>.<namespace>`): the unit id the
project's manifests give their nodes (`$(LWS_NAME)-$(LWS_GROUP_INDEX)`). A --rank given as
well must agree with the environment. Pure (the environment is an argument); a ValueError
names the flag or variable and the bad value.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass

from gateway.base import lws


@dataclass(frozen=True, slots=True)
class Identity:
    unit: str
    rank: int

    @property
    def role(self) -> str:
        return "leader" if self.rank == 0 else "follower"


def identify(
    unit: str | None, rank: int | None, from_env: str | None, env: Mapping[str, str]
) -> Identity:
    if from_env is None:
        if unit is None:
            raise ValueError("--unit: required, unless --from-env lws gives it")
        if rank is None:
            raise ValueError("--rank: required, unless --from-env lws gives it")
        return _checked(unit, rank)
    placement = lws.read(env)
    if rank is not None and rank != placement.rank:
        raise ValueError(
            f"--rank {rank} conflicts with {lws.WORKER_INDEX}={placement.rank} (--from-env lws);"
            " drop --rank or make them agree"
        )
    return _checked(unit or _leader_pod(placement.leader_address), placement.rank)


def _leader_pod(address: str) -> str:
    try:
        ipaddress.ip_address(address)
    except ValueError:
        return address.split(".", 1)[0]
    raise ValueError(
        f"--unit: required here: {lws.LEADER_ADDRESS}={address} is an IP address, not the "
        "leader pod's name the unit id is taken from"
    )


def _checked(unit: str, rank: int) -> Identity:
    if not unit.strip():
        raise ValueError(f"--unit: must not be empty, got {unit!r}")
    if rank < 0:
        raise ValueError(f"--rank: must be >= 0, got {rank}")
    return Identity(unit, rank)
