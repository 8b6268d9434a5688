"""Routing policies: which unit takes a request, whether it may wait, whether it may retry.

Everything here except `admission` is pure and synchronous; clocks and RNGs are arguments.
"""
