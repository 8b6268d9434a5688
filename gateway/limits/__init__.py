"""Limits per API key: requests and tokens per minute (a sliding window) and requests in flight.

`Limiter` (limiter.py) is what the request path calls: `admit`, then `settle` when the answer
ends. The window and lease arithmetic is pure (window.py, lease.py, account.py); the shared
counts live behind a small `Store` interface (store.py) with an in-memory module (one process)
and a Redis one (every replica and worker). docs: see limiter.py's docstring for the policy.
"""
