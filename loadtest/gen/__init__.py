"""The load generator: drives an OpenAI-compatible server (the gateway or a unit) over SSE."""
