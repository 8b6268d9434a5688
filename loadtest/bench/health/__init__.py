"""What unit health costs and how fast it reacts: prober scale and fault detection time.

Prober scale: 1,000 units of 4 nodes probed every second (4,000 probes/s) must cost well under
one core. A second gateway with the same units and `[health] enabled = false` idles through
the same window, so the prober's cost is the difference and not the gateway's fixed upkeep.
The probe rate is measured, not assumed, from the bytes the gateway wrote (probe request
heads are its only writes while no traffic flows): a prober that fell behind would look
cheap. A 1,000-unit /metrics scrape stalls the gateway past the probe timeout, so the window
is watched without one (see scale.py); what one scrape does is measured after it.

Detection time: two units, every node a simulator process of its own; u0's follower is
SIGKILLed (connection refused) or SIGSTOPped (accepts, never answers) and the gateway's
/metrics is polled until u0 is no longer routable, with the default health settings.

Both parts run in one invocation under one pinning: simulators and this harness on one CPU,
the gateways on the other. The machine may be shared: each part first waits for it to be
quiet, and the CPU time of other processes on each core is reported beside the numbers.

    python -m loadtest.bench.health --out DIR [--quick]
"""
