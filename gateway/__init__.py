"""unitgate gateway: routes OpenAI-compatible traffic across multi-node LLM units."""

__version__ = "0.1.0"
