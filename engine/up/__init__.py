"""`unitgate up`: the builtin engine's units of config.toml on this machine, plus the gateway.

plan (config -> node specs, pure), processes (one node process), backoff (restart delays,
pure), supervisor (one unit: start, watch, restart as a whole), main (the command).
"""
