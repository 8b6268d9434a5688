"""Gateway fixtures: a real gateway on loopback (OS-assigned ports) in front of the sim, the
admin tokens the admin tests use, and a real redis-server for the shared-state tests."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest

from gateway.server import Gateway, running
from tests.redis_support import RedisServer, redis_server
from tests.support import SimProcess, gateway_config

# Two operators: the events log names who acted (tests/integration/test_admin.py `call`).
TOKENS = "alice:alice-token,bob:bob-token"


@pytest.fixture
def admin_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    """The admin API's tokens (a test module opts in with usefixtures("admin_tokens"))."""
    monkeypatch.setenv("UNITGATE_ADMIN_TOKEN", TOKENS)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[RedisServer]:
    """A real redis-server of the test's own, on a Unix socket."""
    with redis_server(tmp_path / "redis") as server:
        yield server


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        yield session


@pytest.fixture
async def gateway(clean_sim: SimProcess) -> AsyncIterator[Gateway]:
    async with running(gateway_config(clean_sim.units)) as gw:
        yield gw
