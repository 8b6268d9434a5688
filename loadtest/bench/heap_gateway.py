"""`python -m loadtest.bench.heap_gateway DIR ARGS...`: `unitgate ARGS...` with its Python heap
traced (tracemalloc), for `loadtest.bench.heap`.

Each SIGUSR1 writes a snapshot of what the heap holds then (after a full collection) to
DIR/snapshot-N.pickle, N counting from 0, written under a temporary name and renamed, so a
file that exists is whole. A diagnostic tool: tracing makes every allocation slower and a
snapshot stops the event loop while it is written, so no timing is measured beside it.
"""

from __future__ import annotations

import tracemalloc

tracemalloc.start()  # before the gateway is imported: its modules' own objects are traced too

import gc  # noqa: E402
import itertools  # noqa: E402
import os  # noqa: E402
import pickle  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from types import FrameType  # noqa: E402

from gateway.launcher.cli import main as unitgate  # noqa: E402


def _snapshots(folder: Path) -> None:
    numbers = itertools.count()

    def write(signum: int, frame: FrameType | None) -> None:
        gc.collect()
        snapshot = tracemalloc.take_snapshot()
        path = folder / f"snapshot-{next(numbers)}.pickle"
        partial = path.with_suffix(".partial")
        with partial.open("wb") as f:
            pickle.dump(snapshot, f)
        os.replace(partial, path)

    signal.signal(signal.SIGUSR1, write)


if __name__ == "__main__":
    _snapshots(Path(sys.argv[1]))
    sys.argv = ["unitgate", *sys.argv[2:]]
    sys.exit(unitgate())
