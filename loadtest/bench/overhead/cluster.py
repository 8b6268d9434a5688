"""The overhead benchmark's processes: one simulator and the relays measured over it.

The gateway (twice: resume on and off), the floor relay and the installed peers (nginx,
vllm-router) share the relay CPU and run for the whole benchmark, each idling while another
is measured.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from loadtest.bench.overhead import peers
from loadtest.bench.overhead.params import MODES, PEERS, PYTHON_MODES, TOKENS
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
    relays: dict[str, Relay]  # by mode: MODES and PYTHON_MODES but direct, and peers
    versions: dict[str, str | None]  # the peers', None where not installed

    @property
    def modes(self) -> tuple[str, ...]:
        """What a row measures, in order: direct, the installed peers, then ours (the Python
        relay's gateways before the native ones)."""
        return (MODES[0], *(p for p in PEERS if p in self.relays), *PYTHON_MODES, *MODES[1:])


@contextlib.contextmanager
def cluster(tmp: Path, pins: Pins | None) -> Iterator[Cluster]:
    """The relays run for the whole benchmark and idle while another is measured."""
    toml, plain_toml = tmp / "gw.toml", tmp / "gw-plain.toml"
    py_toml, py_plain_toml = tmp / "gw-py.toml", tmp / "gw-plain-py.toml"
    sim_argv = ["loadtest.simunits", "--units", "2", "--followers", "0", "--ttft-ms", "0"]
    sim_argv += ["--itl-ms", "0", "--tokens", str(TOKENS), "--ready-file", str(tmp / "sim.json")]
    floor_argv = ["loadtest.bench.overhead.floor_relay", "--config", str(toml)]
    floor_argv += ["--ready-file", str(tmp / "floor.json")]
    relay_cpu = None if pins is None else pins.relay
    with child(sim_argv, tmp / "sim.json", None, "simulator") as sim:
        toml.write_text(gateway_toml(sim["units"]))
        plain_toml.write_text(gateway_toml(sim["units"], resume=False))
        py_toml.write_text(gateway_toml(sim["units"], relay="python"))
        py_plain_toml.write_text(gateway_toml(sim["units"], resume=False, relay="python"))
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
            child(
                _gateway_argv(py_toml, tmp / "py.json"),
                tmp / "py.json",
                relay_cpu,
                "gateway (Python relay)",
                True,
            ) as py,
            child(
                _gateway_argv(py_plain_toml, tmp / "py-plain.json"),
                tmp / "py-plain.json",
                relay_cpu,
                "gateway (Python relay, resume off)",
                True,
            ) as py_plain,
            child(floor_argv, tmp / "floor.json", relay_cpu, "floor relay") as floor,
            contextlib.ExitStack() as stack,
        ):
            units = sim["units"]
            leaders = tuple(u["leader"] for u in units)
            versions = peers.versions()
            relays = {}
            for name in PEERS:
                if versions[name] is None:
                    print(f"note: {name} is not installed, so not measured", file=sys.stderr)
                    continue
                if name == "nginx":
                    url, pid = stack.enter_context(peers.nginx(tmp, leaders, relay_cpu))
                else:
                    url, pid = stack.enter_context(peers.vllm_router(leaders, relay_cpu))
                relays[name] = Relay(url, pid)
            relays |= {
                "floor": Relay(floor["public"], int(floor["pid"])),
                "gateway-plain": Relay(plain["public"], int(plain["pid"])),
                "gateway": Relay(gw["public"], int(gw["pid"])),
                "gateway-py": Relay(py["public"], int(py["pid"])),
                "gateway-plain-py": Relay(py_plain["public"], int(py_plain["pid"])),
            }
            yield Cluster(
                control=sim["control"],
                unit_ids=tuple(u["id"] for u in units),
                leaders=leaders,
                relays=relays,
                versions=versions,
            )


def _gateway_argv(toml: Path, ready: Path) -> list[str]:
    argv = ["gateway", "gateway", "--config", str(toml), "--log-level", "warning"]
    return [*argv, "--ready-file", str(ready)]
