"""The workload shape, shared by the processes that serve it, the load and the report."""

from __future__ import annotations

MODEL = "unitgate-sim"
TOKENS = 64
CONCURRENCIES = (32, 128)
ITLS_MS = (0.0, 20.0)
# Within one (ITL, concurrency) row, in this order: the reference first, the gateway last.
# "gateway-plain" is the gateway with [resume] off: the relay without per-event tracking.
MODES = ("direct", "floor", "gateway-plain", "gateway")
