"""What a serving process does with Python's cyclic garbage collector once it has started.

Everything built at start-up (modules, config, the app, the routes, the metrics registry) lives
as long as the process. Left where it is, each full collection walks all of it: about 67,000
objects and 25-30 ms with the event loop stopped, in the middle of every stream in flight.
`freeze_startup` moves it to the collector's permanent generation (`gc.freeze`), so a full
collection walks only what requests made since. Called once a gateway process is serving,
never in tests: a frozen object is never collected, even when it later becomes garbage.
"""

from __future__ import annotations

import gc


def freeze_startup() -> int:
    """Collect the garbage start-up left, then freeze what remains; how many objects froze."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
