"""The launcher, the top floor: the `unitgate` command (cli.py) and `unitgate up` (up/).

It starts what the floors below provide: gateways and their replicas and workers, units of
the builtin engine or vLLM (through the engine's own entry point, `python -m engine`),
redis-server, simulated units. Nothing of the gateway or the engine imports it (tests and
`loadtest/bench` may); tests/architecture holds that.
"""
