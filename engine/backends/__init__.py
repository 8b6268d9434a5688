"""Engine backends (builtin, vllm), chosen by name through `registry`; each is imported only
when selected."""
