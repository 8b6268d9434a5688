"""Fixtures for the simulated units tests: a fast in-process cluster and its control client."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest

from loadtest.simunits import Settings, SimCluster
from loadtest.simunits.client import ControlClient

# Fast enough to keep the suite quick, slow enough that streams really interleave.
FAST = Settings(ttft_ms=5, itl_ms=1, tokens=8)


@pytest.fixture
async def cluster() -> AsyncIterator[SimCluster]:
    """In-process, unlike the suite-wide `sim` subprocess, so tests can reach into unit state."""
    async with SimCluster(units=2, followers=1, settings=FAST) as running:
        yield running


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as client:
        yield client


@pytest.fixture
def control(cluster: SimCluster, session: aiohttp.ClientSession) -> ControlClient:
    return ControlClient(session, cluster.control_url)
