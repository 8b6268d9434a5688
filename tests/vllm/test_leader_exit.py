"""Stopping a vLLM unit's leader stops its follower: vLLM's headless node would wait forever."""

from __future__ import annotations

import signal
from functools import partial
from pathlib import Path

import pytest

from tests.engine.test_up_support import eventually
from tests.vllm.support import group_gone, start_unit

pytestmark = [
    pytest.mark.slow,
    pytest.mark.vllm,
    pytest.mark.timeout(900),
    pytest.mark.usefixtures("vllm_required"),
]


def test_a_stopped_leader_makes_the_follower_exit(tmp_path: Path, tiny_model: Path) -> None:
    unit = start_unit(tmp_path, tiny_model, "u1", world=2)
    try:
        unit.wait_ready()
        follower = unit.followers[0]
        unit.leader.proc.send_signal(signal.SIGTERM)
        assert unit.leader.proc.wait(timeout=90) == 0, unit.leader.tail()
        assert follower.proc.wait(timeout=90) == 1, follower.tail()  # 1: it lost its leader
        assert "gone for" in follower.text()
        for node in unit.procs:  # no engine core or worker outlives its node
            eventually(partial(group_gone, node), 30, f"{node.out.name} group ends")
    finally:
        unit.stop()
