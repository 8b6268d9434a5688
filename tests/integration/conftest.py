"""Gateway fixtures: a real gateway on loopback (OS-assigned ports) in front of the sim."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest

from gateway.server import Gateway, running
from tests.support import SimProcess, gateway_config


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        yield session


@pytest.fixture
async def gateway(clean_sim: SimProcess) -> AsyncIterator[Gateway]:
    async with running(gateway_config(clean_sim.units)) as gw:
        yield gw
