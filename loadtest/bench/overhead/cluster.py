"""The overhead benchmark's processes: one simulator and the three relays measured over it.

The gateway (twice: resume on and off) and the floor relay share the relay CPU and run for
the whole benchmark, each idling while another is measured.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from loadtest.bench.overhead.params import TOKENS
from loadtest.bench.processes import Pins, child, gateway_toml


@dataclass(frozen=True)
class Relay:
    url: str
    pid: int


@dataclass(frozen=True)
class Cluster:
    control: str
    unit_ids: tuple[str, ...]
    leaders: tuple[str, ...]
    relays: dict[str, Relay]  # by mode: "floor", "gateway-plain", "gateway"


@contextlib.contextmanager
def cluster(tmp: Path, pins: Pins | None) -> Iterator[Cluster]:
    """The relays run for the whole benchmark and idle while another is measured."""
    toml, plain_toml = tmp / "gw.toml", tmp / "gw-plain.toml"
    sim_argv = ["loadtest.simunits", "--units", "2", "--followers", "0", "--ttft-ms", "0"]
    sim_argv += ["--itl-ms", "0", "--tokens", str(TOKENS), "--ready-file", str(tmp / "sim.json")]
    floor_argv = ["loadtest.bench.overhead.floor_relay", "--config", str(toml)]
    floor_argv += ["--ready-file", str(tmp / "floor.json")]
    relay_cpu = None if pins is None else pins.relay
    with child(sim_argv, tmp / "sim.json", None, "simulator") as sim:
        toml.write_text(gateway_toml(sim["units"]))
        plain_toml.write_text(gateway_toml(sim["units"], resume=False))
        with (
            child(
                _gateway_argv(toml, tmp / "gw.json"), tmp / "gw.json", relay_cpu, "gateway", True
            ) as gw,
            child(
                _gateway_argv(plain_toml, tmp / "plain.json"),
                tmp / "plain.json",
                relay_cpu,
                "gateway (resume off)",
                True,
            ) as plain,
            child(floor_argv, tmp / "floor.json", relay_cpu, "floor relay") as floor,
        ):
            units = sim["units"]
            yield Cluster(
                control=sim["control"],
                unit_ids=tuple(u["id"] for u in units),
                leaders=tuple(u["leader"] for u in units),
                relays={
                    "floor": Relay(floor["public"], int(floor["pid"])),
                    "gateway-plain": Relay(plain["public"], int(plain["pid"])),
                    "gateway": Relay(gw["public"], int(gw["pid"])),
                },
            )


def _gateway_argv(toml: Path, ready: Path) -> list[str]:
    argv = ["gateway", "gateway", "--config", str(toml), "--log-level", "warning"]
    return [*argv, "--ready-file", str(ready)]
