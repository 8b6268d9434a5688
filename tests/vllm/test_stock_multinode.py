"""A stock multi-node vLLM unit behind a real gateway: `vllm serve` (vLLM 0.32's own OpenAI
server) leading a tensor-parallel pair with a `--headless` follower, which runs no HTTP server;
`unitgate watch` answers the node contract for it. The unit is `kind = "vllm"` with
`nodes = [leader, sidecar]`: it serves a chat through the gateway, and a follower stopped
(SIGSTOP) or killed (SIGKILL) ejects it within a few probe rounds, while vLLM's own leader
/health would stay 200 for 30 s and more.

The tiny checkpoint (2 query and 2 KV heads) splits over two ranks, so the unit is the cheapest
multi-node one there is; it takes a minute or two to start on two cores, so one unit serves the
module, and the kill is its last test. Detection times are printed (run with -s) and recorded.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from openai import AsyncOpenAI

from gateway.config import config_from_dict
from gateway.server import Gateway, running
from gateway.units import UnitState
from tests.integration.probing import until
from tests.support import until_routable
from tests.vllm.stock_multinode_support import SERVED, StockUnit, start_unit, start_watch

pytestmark = [
    pytest.mark.slow,
    pytest.mark.vllm,
    pytest.mark.timeout(900),
    pytest.mark.usefixtures("vllm_required"),
]
UNIT = "v0"
QUESTION = [{"role": "user", "content": "hello, unit"}]


@pytest.fixture(scope="module")
def stock(
    tmp_path_factory: pytest.TempPathFactory, tiny_model: Path, vllm_required: None
) -> Iterator[StockUnit]:
    tmp = tmp_path_factory.mktemp("stock-multinode")
    unit = start_unit(tmp, tiny_model)
    try:
        took = unit.wait_ready()
        print(f"\nstock TP=2 vLLM unit (leader + headless follower) ready in {took:.0f} s")
        start_watch(tmp, unit, UNIT)
        yield unit
    finally:
        unit.stop()


@pytest.fixture
async def gateway(stock: StockUnit) -> AsyncIterator[Gateway]:
    raw: dict[str, Any] = {
        "gateway": {"port": 0, "models": [SERVED], "shutdown_timeout": 5.0},
        "metrics": {"port": 0},
        "routing": {"affinity": "none"},
        # Two vLLM nodes busy on two cores: probes get room to answer late.
        "health": {"interval": 0.25, "timeout": 1.0, "fall": 2, "stall_timeout": 30.0},
        "timeouts": {"first_byte": 120.0, "idle": 60.0},
        "breaker": {"enabled": False},
        "admin": {"enabled": False},
        "units": [
            {
                "id": UNIT,
                "kind": "vllm",
                "leader": stock.url,
                "nodes": [stock.url, stock.watch_url],
            }
        ],
    }
    async with running(config_from_dict(raw)) as gw:
        await until_routable(gw, within=30.0)
        yield gw


def the_unit(gw: Gateway) -> UnitState:
    return gw.units.units[UNIT]


async def ejected_after(
    gw: Gateway, stock: StockUnit, sig: signal.Signals, within: float
) -> tuple[float, str]:
    """Send `sig` to the follower's main process; seconds until the unit is not healthy, and
    why. Fails (with the nodes' log tails) at twice the allowed time, so a slow detection is
    still measured and reported by the caller's assertion."""
    unit = the_unit(gw)
    assert unit.healthy, unit.reasons
    loop = asyncio.get_running_loop()
    signalled = loop.time()
    os.kill(stock.follower.pid, sig)
    try:
        await until(lambda: not unit.healthy, 2 * within, f"{UNIT} ejected after {sig.name}")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; reasons {unit.reasons}\n{stock.tails()}") from None
    return loop.time() - signalled, unit.reasons.get("healthy", "")


async def test_the_unit_is_routable_and_answers_a_chat(gateway: Gateway, stock: StockUnit) -> None:
    unit = the_unit(gateway)
    assert [node.healthy for node in unit.nodes] == [True, True]
    assert unit.nodes[1].pid == stock.follower.pid  # the sidecar reports the follower's pid
    api = AsyncOpenAI(base_url=f"{gateway.public_url}/v1", api_key="unused", max_retries=0)
    answer = await api.chat.completions.create(
        model=SERVED,
        messages=QUESTION,  # type: ignore[arg-type]
        max_tokens=8,
        temperature=0,
        extra_body={"ignore_eos": True},
        timeout=120,
    )
    assert answer.model == SERVED and answer.choices[0].message.content
    assert answer.usage is not None and answer.usage.completion_tokens == 8


async def test_a_stopped_follower_ejects_the_unit_within_2_s(
    gateway: Gateway, stock: StockUnit, record_property: Any
) -> None:
    try:
        took, reason = await ejected_after(gateway, stock, signal.SIGSTOP, 2.0)
    finally:
        os.kill(stock.follower.pid, signal.SIGCONT)
    back = await until(lambda: the_unit(gateway).healthy, 10.0, f"{UNIT} readmitted")
    record_property("sigstop_detection_s", round(took, 3))
    print(f"\nSIGSTOP of the follower: ejected in {took:.3f} s ({reason})")
    print(f"SIGCONT: readmitted in {back:.3f} s")
    assert reason.startswith("node 1 (follower") and "status stopped" in reason, reason
    assert took < 2.0


async def test_a_killed_follower_ejects_the_unit_within_1_s(
    gateway: Gateway, stock: StockUnit, record_property: Any
) -> None:
    """Last in the module: the unit is broken for good after it."""
    took, reason = await ejected_after(gateway, stock, signal.SIGKILL, 1.0)
    record_property("sigkill_detection_s", round(took, 3))
    print(f"\nkill -9 of the follower: ejected in {took:.3f} s ({reason})")
    # Not reaped yet, the killed process may still be a zombie: gone either way.
    assert reason.startswith("node 1 (follower"), reason
    assert "status gone" in reason or "status zombie" in reason, reason
    assert took < 1.0
