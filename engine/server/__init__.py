"""The leader node's OpenAI-compatible HTTP server; it only talks to an `engine.api.Engine`."""

from engine.server.app import build_app, serve

__all__ = ["build_app", "serve"]
