"""Prefix routing against stock vLLM: where requests sharing long prompt prefixes go, and what
that does to time to first token and the fleet's prefix cache hit rate.

Two stock `vllm serve` servers (the SmolLM2 export, float32, each engine on a core of its
own, each publishing its KV cache events) with KV caches small enough to evict, behind four
routers side by side in one run (routes.py): the gateway by load alone, the gateway's
approximate prefix affinity, vllm-router's `cache_aware` policy, and the gateway routing by
what each unit has cached (`prefix_scorer = "auto"`, the units' KV events and the model's
tokenizer). The workload (workload.py) is groups of requests sharing a long system prompt,
each with a short question of its own, sent at a fixed concurrency; at each pressure (the
working set's share of the fleet's KV blocks, pressure.py) every mode in turn gets the same
requests in the same order from empty caches (vLLM's dev-mode reset, fleet.py).

Reported per mode and pressure: TTFT p50/p90/p99, output tokens/s, the fleet's hit rate from
vLLM's counters (against the ceiling the requests allow), how even the load was; for the
precise mode the gateway's KV index and event figures. Needs both venvs: the gateway,
vllm-router and the load from `.venv` (extras kv and bench), the servers from `.venv-vllm`.

    python -m loadtest.bench.prefix --out DIR [--quick]           (`make bench-prefix`)
"""
