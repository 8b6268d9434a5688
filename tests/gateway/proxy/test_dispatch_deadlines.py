"""Which first-byte deadline a dispatcher's attempt gets (the harness of test_dispatch.py, in
tests/gateway/proxy/dispatch_support.py): a stream's is `first_byte`, a whole answer's `total`, and
neither passes the call's own deadline."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from gateway.errors import UpstreamError
from gateway.outcomes import Failure
from gateway.proxy.call import Call
from gateway.proxy.upstream import Answer
from tests.gateway.proxy import dispatch_support
from tests.gateway.proxy.dispatch_support import HEAVY, Make, Rig
from tests.gateway.servers import Peer, RawServer

JSON_OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


# The shared fixture (dispatch_support.rigs), registered in this module: the prober tests
# have a `rigs` of their own, so it cannot live in tests/gateway/conftest.py.
rigs = dispatch_support.rigs


def answer_after(delay: float) -> Callable[[Peer, bytes], None]:
    def answer(peer: Peer, request: bytes) -> None:
        asyncio.get_running_loop().call_later(delay, peer.write, JSON_OK)

    return answer


async def open_timed(rig: Rig, call: Call) -> tuple[float, Answer | UpstreamError]:
    loop = asyncio.get_running_loop()
    start = loop.time()
    with call.lease:
        try:
            _, answer = await rig.dispatcher.open(call)
        except UpstreamError as exc:
            return loop.time() - start, exc
    return loop.time() - start, answer


async def test_a_stream_has_first_byte_to_its_first_byte_and_a_whole_answer_total(
    rigs: Make,
) -> None:
    """A non-streamed answer's first byte comes when it is complete: only `total` bounds it."""
    async with RawServer(answer_after(0.3)) as slow:
        rig = rigs(
            [("a", slow.url, HEAVY)],
            timeouts={"first_byte": 0.1, "total": 2.0},
            retry={"max_attempts": 1},
        )
        stream = rig.call(stream=True)
        took, got = await open_timed(rig, stream)
        assert stream.first_byte == 0.1
        # Timed out at first_byte: with `total` the answer (at 0.3 s) would have come in time.
        assert isinstance(got, UpstreamError) and got.kind is Failure.FIRST_BYTE_TIMEOUT
        assert 0.09 <= took < 1.0

        whole = rig.call(stream=False)
        took, got = await open_timed(rig, whole)
        assert whole.first_byte == 2.0
        assert isinstance(got, Answer) and got.first == b"{}"
        assert took >= 0.29
        assert rig.admission.inflight == 0


async def test_the_first_byte_deadline_never_passes_the_calls_own(rigs: Make) -> None:
    async with RawServer(answer_after(0.5)) as slow:
        rig = rigs([("a", slow.url, HEAVY)], retry={"max_attempts": 1})
        call = rig.call(stream=True, within=0.1)  # what is left of the request's total time
        took, got = await open_timed(rig, call)
        assert call.first_byte == 1.0
        # At the call's deadline: by first_byte (1 s) the answer (at 0.5 s) would have come.
        assert isinstance(got, UpstreamError) and got.kind is Failure.FIRST_BYTE_TIMEOUT
        assert 0.09 <= took < 1.0
