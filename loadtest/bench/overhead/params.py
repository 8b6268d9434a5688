"""The overhead benchmark's workload shape, shared by its processes, its load and its report."""

from __future__ import annotations

TOKENS = 64
CONCURRENCIES = (32, 128)
ITLS_MS = (0.0, 20.0)
# Within one (ITL, concurrency) row, in this order: the reference first, the gateway last.
# "gateway-plain" is the gateway with [resume] off: the relay without per-event tracking.
MODES = ("direct", "floor", "gateway-plain", "gateway")
# Other relays over the same leaders, measured in the same row when installed (peers.py).
PEERS = ("nginx", "vllm-router")
# The gateway again with its Python relay ([upstream] relay = "python"), resume on and off:
# the native relay's before and after, in the same row.
PYTHON_MODES = ("gateway-py", "gateway-plain-py")
