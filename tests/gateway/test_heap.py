"""The start-up heap is frozen out of the cyclic collector's full collections (gateway.heap).

In a child process each time: a frozen object is never collected, so freezing the test
process itself would keep every later test's cyclic garbage alive.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap


def run(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_freezing_leaves_a_full_collection_only_what_came_after() -> None:
    out = run(
        """
        import gc
        import gateway.server  # the gateway's modules: what start-up builds
        from gateway.heap import freeze_startup

        before = len(gc.get_objects())
        frozen = freeze_startup()
        after_freeze = len(gc.get_objects())
        made = [[i] for i in range(1000)]  # a request's worth of new containers
        gc.collect()
        print(before, frozen, after_freeze, len(gc.get_objects()))
        """
    )
    before, frozen, after_freeze, later = map(int, out.split())
    assert before > 20_000  # the imports alone: what a full collection walked every time
    assert frozen >= before * 0.9  # the start-up heap (less its garbage) is frozen
    assert after_freeze < 100  # the collector no longer sees it...
    assert 1000 <= later < 1200  # ...only what was made since
