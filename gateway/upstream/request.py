"""The head of every request the gateway sends a leader: the request path's attempts and the
prober's canary alike."""

from __future__ import annotations

from gateway.upstream.pool import Endpoint


def request_head(
    endpoint: Endpoint,
    path: str,
    length: int,
    request_id: str,
    traceparent: str | None,
    extra: bytes = b"",
    method: str = "POST",
) -> bytes:
    """The head of every request to a leader (proxied requests and the prober's canary): a
    POST, or a GET of a stored response or of the tokenizer's description (no body). `extra`
    is the unit's own header lines (its API key, its `headers`): the client's own headers,
    its Authorization among them, never reach a unit."""
    trace = f"traceparent: {traceparent}\r\n" if traceparent else ""
    return (
        (
            f"{method} {path} HTTP/1.1\r\nHost: {endpoint.host_header.decode()}\r\n"
            f"Content-Type: application/json\r\nAccept: */*\r\nContent-Length: {length}\r\n"
            f"x-request-id: {request_id}\r\n{trace}"
        ).encode("latin-1")
        + extra
        + b"\r\n"
    )
