"""Shared fixtures: uvloop for every async test, simulated units in a real subprocess."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import uvloop

from tests.support import SimProcess, start_sim, stop_process

# Tests that load both cores themselves or measure time under load run alone (`make test`
# runs the others two at a time, pytest-xdist): the chaos scenarios, and the slow tests of the
# engine (model runs on every core, process groups with deadlines) and of the benchmarks.
SERIAL_SLOW = ("tests/engine/", "tests/loadtest/test_bench_")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = config.rootpath
    for item in items:
        where = item.path.relative_to(root).as_posix() if item.path.is_relative_to(root) else ""
        slow_here = item.get_closest_marker("slow") and where.startswith(SERIAL_SLOW)
        if item.get_closest_marker("chaos") or slow_here:
            item.add_marker(pytest.mark.serial)


def pytest_asyncio_loop_factories(config: pytest.Config, item: pytest.Item) -> dict[str, object]:
    """Async tests run on uvloop, the loop the gateway runs on in production."""
    return {"uvloop": uvloop.new_event_loop}


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimProcess]:
    """Three simulated units (one follower each): 5 ms to first token, 2 ms between 8 tokens."""
    tmp = tmp_path_factory.mktemp("sim")
    process = start_sim(
        tmp, "--units", "3", "--followers", "1", "--ttft-ms", "5", "--itl-ms", "2", "--tokens", "8"
    )
    yield process
    stop_process(process.proc)


@pytest.fixture
def clean_sim(sim: SimProcess) -> SimProcess:
    sim.post("/reset")
    return sim
