"""What the gateway costs: the same simulated units hit directly, through a floor relay,
through the gateway (resumable and plain, each with its native and its Python relay), and
through the peers it is measured against: nginx and vllm-router (peers.py), when installed.

All modes run in one invocation, against one simulator under one pinning, so that the
differences between them are the relays and not machine drift between runs. The floor relay
(floor_relay.py, run as `loadtest.bench.overhead.floor_relay`) forwards bytes verbatim: the
least any Python relay on this machine pays per request, and so the yardstick for the
gateway's own work. The aims, at every concurrency: the resumable gateway (native relay) at
most the floor's CPU per request + 150 us at 0 ms between tokens and + 600 us at 20 ms, and
TTFT p99 no worse than vllm-router's. The CPU ratios to the peers are shown for information;
the JSON records the aims and the peers' versions.

    python -m loadtest.bench.overhead --out DIR [--quick]      (`make bench` installs peers)
"""
