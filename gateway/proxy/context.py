"""What every phase of the request path shares, built once by the handler.

The phases (the stream's relay and resumption) take this instead of the handler, so no
phase imports the module above it: the handler sequences the phases, the phases never reach
back into the handler. What is particular to one request is on its Call, not here.
"""

from __future__ import annotations

from gateway.config import Config
from gateway.proxy.call import Call
from gateway.proxy.dispatch import Dispatcher
from gateway.proxy.live import LiveStreams
from gateway.proxy.upstream import UpstreamClient
from gateway.signals import Signals


class ProxyContext:
    __slots__ = ("config", "dispatcher", "live", "signals", "upstream")

    def __init__(self, config: Config, dispatcher: Dispatcher, live: LiveStreams) -> None:
        self.config, self.dispatcher, self.live = config, dispatcher, live
        self.upstream: UpstreamClient = dispatcher.upstream
        self.signals: Signals[Call] = dispatcher.signals
