"""The profiler's command line: the peers (nginx, vllm-router) are not Python, so only the
samplers that see compiled code (perf, strace) may be pointed at them."""

from __future__ import annotations

import pytest

from loadtest.bench.profile import _parse, gc_totals, library_shares, tally


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


def test_perf_reports_split_by_library() -> None:
    report = """# To display the perf.data header info, please use --header/--header-only options.
#
# Samples: 2K of event 'cpu-clock:pppH'
# Event count (approx.): 1441000000
#
# Overhead  Shared Object
# ........  .......................
#
    45.14%  libpython3.11.so.1.0
    38.01%  [kernel.kallsyms]
     0.97%  _relay-ce63a5db10ca862d.cpython-311-x86_64-linux-gnu.so


#
# (Tip: see the header with: perf report --header-only)
#
"""
    assert library_shares(report) == [
        ("libpython3.11.so.1.0", 45.14),
        ("kernel", 38.01),
        ("_relay-ce63a5db10ca862d.cpython-311-x86_64-linux-gnu.so", 0.97),
    ]
    assert library_shares("Error:\nThe perf.data data has no samples!\n") == []


def test_the_answers_length_is_a_positive_count(capsys: pytest.CaptureFixture[str]) -> None:
    assert _parse(["--tokens", "16", "--itl", "80"]).tokens == 16
    assert _parse([]).tokens == 64
    with pytest.raises(SystemExit):
        _parse(["--tokens", "0"])
    assert "--tokens must be at least 1, not 0" in capsys.readouterr().err


def test_other_threads_samples_are_kept_apart_from_the_main_threads() -> None:
    """An idle thread pool worker (py-spy counts its wait as running) must not dilute the main
    thread's shares."""
    lines = [
        "<module> (gateway/__main__.py:7);run (uvloop/__init__.py:92) 50",
        "<module> (gateway/__main__.py:7);run (uvloop/__init__.py:92);_proxy (h.py:84) 30",
        "Thread._bootstrap (threading.py:1002);Thread.run (threading.py:982);"
        "_worker (concurrent/futures/thread.py:81) 211",
    ]
    main, others = tally(lines)
    assert main.samples == 80 and others.samples == 211
    assert main.own["run (uvloop/__init__.py:92)"] == 50 and main.own["_proxy (h.py:84)"] == 30
    assert main.total["<module> (gateway/__main__.py:7)"] == 80
    assert "_worker (concurrent/futures/thread.py:81)" not in main.total
    assert others.own == {"_worker (concurrent/futures/thread.py:81)": 211}


def test_gc_is_read_from_a_gateway_with_no_other_sampler(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert _parse(["--gc"]).gc and _parse(["--gc", "--relay", "python"]).gc
    refused = (["--relay", "floor"], ["--relay", "router", "--perf"], ["--perf"], ["--idle", "5"])
    for argv in refused:
        with pytest.raises(SystemExit):
            _parse(["--gc", *argv])
        assert "--gc reads a gateway under load" in capsys.readouterr().err


def test_gc_totals_by_generation_from_metrics_text() -> None:
    text = """# HELP unitgate_gc_pause_seconds Python garbage collections.
# TYPE unitgate_gc_pause_seconds histogram
unitgate_gc_pause_seconds_bucket{generation="0",le="0.001"} 150.0
unitgate_gc_pause_seconds_bucket{generation="0",le="+Inf"} 153.0
unitgate_gc_pause_seconds_count{generation="0"} 153.0
unitgate_gc_pause_seconds_sum{generation="0"} 0.013
unitgate_gc_pause_seconds_bucket{generation="2",le="+Inf"} 1.0
unitgate_gc_pause_seconds_count{generation="2"} 1.0
unitgate_gc_pause_seconds_sum{generation="2"} 0.00046
# TYPE unitgate_requests_total counter
unitgate_requests_total{unit="u0",model="m",status="200"} 7.0
"""
    assert gc_totals(text) == {"0": (153.0, 0.013), "2": (1.0, 0.00046)}
    assert gc_totals("# nothing here\n") == {}
