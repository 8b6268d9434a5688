"""Does the leader's /health still answer in time when the leader is saturated?

One real builtin unit of two nodes (`unitgate node`, the seeded tiny model), the leader given
a health port, so the same process answers /health twice: on the API port, from the event loop
that also writes every token of every stream (before), and on its thread listener (after).
Both are probed alternately over keep-alive connections, like the gateway's prober, first idle
and then while the project's load generator keeps more concurrent streams in flight than the
leader has KV slots (requests queue). Each probe has a 2 s deadline; the gateway's own probe
timeout is 0.2 s, so the share of probes over 200 ms is the figure that matters.

On a machine with 2+ CPUs the leader runs alone on one CPU; the follower, the load generator
and this prober share another (the affinity `taskset -c` would set), so what the leader's
/health pays is the leader's own contention.

    python -m loadtest.bench.leader_health --out DIR
"""
