"""Floor reference for the overhead benchmark: a verbatim TCP byte relay. Not a gateway.

This is a benchmark reference only. It does no routing, validation, retries, health or
metrics, and it never parses HTTP: each client connection gets one upstream connection to a
simulated leader, chosen round-robin, and bytes go through unchanged both ways until either
side closes. What it spends per streamed request is therefore the lower bound of what any
Python relay on this machine pays in syscalls and event-loop work; the gateway's CPU per
request divided by this relay's is what the gateway's own work costs.

    python -m loadtest.bench.overhead.floor_relay --config GW_TOML --ready-file F
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import uvloop

from gateway.base.readyfile import write_ready
from loadtest.simunits.topology import Address, ConfigError, load_config

HOST = "127.0.0.1"
BACKLOG = 1024
CONNECT_TIMEOUT_S = 5.0
SHUTDOWN_TIMEOUT_S = 5.0


class _Side(asyncio.Protocol):
    """One end of a client <-> leader pipe.

    Each end stops reading while the other end's write buffer is full, so a slow reader on
    either side stalls the writer instead of growing the relay's memory.
    """

    def __init__(self, live: set[_Side], client: _Side | None = None) -> None:
        self.transport: asyncio.Transport | None = None
        self.peer: _Side | None = None
        self._live = live
        self._client = client  # set on the upstream end only, until linked
        self._early = b""  # client bytes that arrived before the upstream was connected
        self._write_paused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self._live.add(self)
        if self._client is not None:
            self._link(self._client)
            self._client = None

    def data_received(self, data: bytes) -> None:
        peer = self.peer
        if peer is not None and peer.transport is not None:
            peer.transport.write(data)
            return
        # uvloop starts reading right after connection_made, so a pause there does not hold;
        # the request's first bytes can beat the upstream connect, and wait here for it.
        self._early += data
        assert self.transport is not None
        self.transport.pause_reading()

    def eof_received(self) -> bool:
        self._close_peer()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._live.discard(self)
        self._close_peer()

    def pause_writing(self) -> None:
        self._write_paused = True
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        self._write_paused = False
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.resume_reading()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def _close_peer(self) -> None:
        """close() flushes what is buffered first, so an answer's tail is not cut off."""
        if self.peer is not None:
            self.peer.close()

    def _link(self, client: _Side) -> None:
        """Called on the upstream end; carries over what the client did before the link."""
        assert self.transport is not None and client.transport is not None
        self.peer, client.peer = client, self
        if client.transport.is_closing():
            self.transport.close()
            return
        if client._early:
            self.transport.write(client._early)
            client._early = b""
        if client._write_paused:
            self.transport.pause_reading()
        if not self._write_paused:
            client.transport.resume_reading()


class _Relay:
    def __init__(self, leaders: list[Address]) -> None:
        self.live: set[_Side] = set()
        self._leaders: Iterator[Address] = itertools.cycle(leaders)
        self._connecting: set[asyncio.Task[None]] = set()

    def accept(self) -> _Side:
        client = _Side(self.live)
        task = asyncio.get_running_loop().create_task(self._connect(client, next(self._leaders)))
        self._connecting.add(task)
        task.add_done_callback(self._connecting.discard)
        return client

    async def _connect(self, client: _Side, leader: Address) -> None:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                await loop.create_connection(
                    lambda: _Side(self.live, client), leader.host, leader.port
                )
        except (OSError, TimeoutError):
            client.close()

    async def close(self) -> None:
        for task in list(self._connecting):
            task.cancel()
        for side in list(self.live):
            side.close()
        await asyncio.gather(*self._connecting, return_exceptions=True)


async def _serve(leaders: list[Address], ready_file: Path) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    relay = _Relay(leaders)
    server = await loop.create_server(relay.accept, HOST, 0, backlog=BACKLOG)
    try:
        port = server.sockets[0].getsockname()[1]
        write_ready(ready_file, {"pid": os.getpid(), "public": f"http://{HOST}:{port}"})
        await stop.wait()
    finally:
        server.close()
        await relay.close()
        async with asyncio.timeout(SHUTDOWN_TIMEOUT_S):
            await server.wait_closed()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m loadtest.bench.overhead.floor_relay",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--config", type=Path, required=True, help="gateway TOML; its [[units]]")
    p.add_argument("--ready-file", type=Path, required=True, help="pid and URL, once listening")
    args = p.parse_args(argv)
    try:
        leaders = [unit.leader for unit in load_config(args.config)]
    except ConfigError as exc:
        print(f"floor_relay: {exc}", file=sys.stderr)
        return 2
    uvloop.run(_serve(leaders, args.ready_file))
    return 0


if __name__ == "__main__":
    sys.exit(main())
