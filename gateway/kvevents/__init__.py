"""What each unit's KV cache holds, from its engine's own events: vLLM's wire format read
(wire.py) and the index of cached blocks by the gateway's own block keys (index.py), for
routing to send a request where its prompt's prefix is already cached (not yet wired in)."""
