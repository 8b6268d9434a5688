"""The lean front's request object on its own, with a connection that records its writes:
how a streamed answer's bytes are grouped into writes (the real sockets: test_front.py)."""

from __future__ import annotations

from gateway.front.head import read_head
from gateway.front.request import LeanRequest


def _post(path: str) -> bytes:
    return f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n".encode()


class _Recording:
    """The lean request's connection, recording its transport's writes."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.transport = self

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def is_closing(self) -> bool:
        return False

    async def drained(self) -> None:
        return None


async def test_a_streamed_head_goes_out_with_the_first_bytes() -> None:
    conn = _Recording()
    head = read_head(_post("/stream"), {b"/stream"}, cors=False)
    assert head is not None
    request = LeanRequest(conn, head)  # type: ignore[arg-type]
    assert await request.open_stream(200, {"Content-Type": "text/event-stream"})
    assert conn.writes == []  # kept for the first bytes
    await request.write(b"data: 1\n\n")
    assert len(conn.writes) == 1
    assert conn.writes[0].startswith(b"HTTP/1.1 200 OK\r\n")
    assert conn.writes[0].endswith(b"\r\n\r\n9\r\ndata: 1\n\n\r\n")
    assert request.take_head() == b""  # it went out
    await request.end_stream()
    assert conn.writes[1:] == [b"0\r\n\r\n"] and request.keep_alive
