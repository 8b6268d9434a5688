"""The gateway on every core: worker processes behind one port, one control plane.

With `[gateway].workers` > 1 the process started is the control plane (`control.py`): it owns
the probers, the breakers, the admin API, the events log and the operator listener, and
starts the workers (`pool.py`). Each worker (`worker.py`) accepts on the public port with
SO_REUSEPORT and routes from the control plane's state (`state.py`), which reaches it over a
socket pair (`frames.py`) as one versioned message per change; it sends back what only
traffic can tell (`report.py`): breaker evidence, which units' streams flow, in-flight counts,
and events.
"""
