"""Metrics and logs. Observers read the request path's state; they never steer it."""
