"""What the gateway costs: the same simulated units hit directly, through a floor relay and
through the gateway.

All three modes run in one invocation, against one simulator under one pinning, so that the
differences between them are the relays and not machine drift between runs. The floor relay
(floor_relay.py, run as `loadtest.bench.overhead.floor_relay`) forwards bytes verbatim: the
least any Python relay on this machine pays per request, and so the yardstick for the
gateway's own work.

    python -m loadtest.bench.overhead --out DIR [--quick]
"""
