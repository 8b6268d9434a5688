"""What the gateway costs: the same simulated units hit directly, through a floor relay,
through the gateway (resumable and plain, each with its native and its Python relay), and
through the peers it is measured against: nginx and vllm-router (peers.py), when installed.

All modes run in one invocation, against one simulator under one pinning, so that the
differences between them are the relays and not machine drift between runs. The floor relay
(floor_relay.py, run as `loadtest.bench.overhead.floor_relay`) forwards bytes verbatim: the
least any Python relay on this machine pays per request, and so the yardstick for the
gateway's own work. The tables' last columns are the aims: the resumable gateway's CPU per
stream over vllm-router's (aim <= 0.9), the plain one's over nginx's (aim <= 1.0), and TTFT
p99 no worse than vllm-router's; the JSON records the peers' versions.

    python -m loadtest.bench.overhead --out DIR [--quick]      (`make bench` installs peers)
"""
