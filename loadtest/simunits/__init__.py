"""Simulated units: a test and load-test stand-in for real multi-node engine units.

It speaks the node contract real engine nodes will expose (OpenAI API on the leader,
/health on every node) and adds a control API for injecting faults.
"""

from loadtest.simunits.cluster import SimCluster
from loadtest.simunits.state import (
    Fault,
    FaultMode,
    HealthMode,
    NodeHealth,
    Settings,
    ToolsMode,
)
from loadtest.simunits.topology import Address, UnitSpec
from loadtest.simunits.unit import SimUnit

__all__ = [
    "Address",
    "Fault",
    "FaultMode",
    "HealthMode",
    "NodeHealth",
    "Settings",
    "SimCluster",
    "SimUnit",
    "ToolsMode",
    "UnitSpec",
]
