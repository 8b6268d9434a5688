"""The relay: an answer's bytes from a unit's connection to the client, read by read, in two
implementations side by side. The Python one (pump.py, tracker.py, sse.py, usage.py, pace.py)
is the reference; the compiled one (native/) does the same per-read work in one C call and is
tested against it. `[upstream] relay` chooses (native/__init__.py's `resolve`)."""
