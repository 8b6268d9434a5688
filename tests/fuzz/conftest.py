"""Fixtures of the HTTP fuzz tests: one gateway subprocess per module in front of the simulated
units (u0 serves fuzzed requests, u1 the control streams) and a scripted raw unit."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import orjson
import pytest

from tests.fuzz.harness import (
    ControlStreams,
    GatewayProcess,
    RawUnit,
    reference_stream,
    start_gateway,
)
from tests.support import SimProcess, chat_body, stop_process


@pytest.fixture(scope="module")
def raw_unit() -> Iterator[RawUnit]:
    unit = RawUnit()
    yield unit
    unit.close()


@pytest.fixture(scope="module")
def gw(
    sim: SimProcess, raw_unit: RawUnit, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    # u1's control stream: 150 tokens 4 ms apart (~0.6 s), well inside the 4 s total timeout.
    sim.post("/units/u1/settings", {"ttft_ms": 5, "itl_ms": 4, "tokens": 150})
    process = start_gateway(tmp_path_factory.mktemp("gw"), sim, raw_unit)
    yield process
    code = stop_process(process.proc)
    log = process.log_text()
    # Client-caused input must never make the gateway log a traceback (an exception escaping a
    # handler is a 500) or make it die.
    escaped = process.escaped_errors()
    assert not escaped, escaped[:3]
    assert code == 0, log[-4000:]


@pytest.fixture(scope="module")
def control(sim: SimProcess, gw: GatewayProcess) -> Callable[[], ControlStreams]:
    body = orjson.dumps(chat_body(max_tokens=150))
    reference = reference_stream(sim, body)
    return lambda: ControlStreams(gw, reference, body)
