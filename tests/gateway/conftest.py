"""Fixtures shared by the gateway's component tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from gateway.config import config_from_dict
from gateway.proxy.upstream import UpstreamClient


@pytest.fixture
async def upstream() -> AsyncIterator[UpstreamClient]:
    """A real UpstreamClient (1 s connect timeout), for the relay tests; closed after."""
    client = UpstreamClient(config_from_dict({"timeouts": {"connect": 1.0}}))
    yield client
    await client.close()
