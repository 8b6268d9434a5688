"""Data-plane API keys: who a request is from (its tenant), and what its key allows."""
