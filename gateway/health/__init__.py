"""Unit health: per-unit probers over every node, and per-unit circuit breakers."""
