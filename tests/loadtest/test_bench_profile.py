"""The profiler's command line: the peers (nginx, vllm-router) are not Python, so only the
samplers that see compiled code (perf, strace) may be pointed at them."""

from __future__ import annotations

import pytest

from loadtest.bench.profile import _parse


@pytest.mark.parametrize("peer", ["nginx", "router"])
def test_a_peer_is_profiled_with_perf_or_strace_only(
    peer: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        _parse(["--relay", peer])
    assert f"--relay {peer} is not Python" in capsys.readouterr().err
    assert _parse(["--relay", peer, "--syscalls"]).relay == peer
    assert _parse(["--relay", peer, "--perf"]).perf


def test_the_gateway_and_the_floor_take_py_spy() -> None:
    for relay in ("native", "python", "floor"):
        args = _parse(["--relay", relay])
        assert args.relay == relay and not args.perf and not args.syscalls
