"""tests/conformance is the `make conformance` harness (vLLM's own server tests run against a
stock vLLM and through the gateway), not a test suite of this repo: `make test` and pytest
collect nothing here."""

collect_ignore_glob = ["*"]
