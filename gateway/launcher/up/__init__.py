"""`unitgate up`: the builtin engine's units of config.toml on this machine, plus the gateway.

plan (config -> node specs, pure), processes (one node process; starting and stopping any
child), backoff (restart delays, pure), ports (which port to give a child; are the replicas'
free), supervisor (one unit: start, watch, restart as a whole), units (the builtin units, or
simulated: simulated), ready (when to say ready, and what), main (the command). With
`--replicas N`: fleet (each replica's ports and config, pure), redis_server (the shared
store), replicas (child replicas, from `up`'s side), replica (`unitgate replica`, a child
replica's command), readyfile (how children say they are ready).
"""
