"""Helpers of `python -m loadtest.bench_engine` (see that module's docstring)."""
