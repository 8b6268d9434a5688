"""What a call keeps of its request once intake accepted it: thousands of streams stay open at
once, so only a resumable stream keeps the client's body (as bytes, its smallest form), and
the parsed request a continuation is built from is read again from it when one is needed."""

from __future__ import annotations

import orjson
import pytest

from gateway.paths import CHAT_PATH
from gateway.proxy.call import Call
from gateway.proxy.lease import Lease
from gateway.proxy.tracker import StreamTracker
from gateway.proxy.validation import RequestInfo
from gateway.routing.admission import Admission

REQUEST = {"model": "m", "messages": [{"role": "user", "content": "hé"}], "stream": True}


def call() -> Call:
    return Call(CHAT_PATH, "r1", {}, 0.0, 60.0, Lease(Admission(8, 1.0, 1)))


@pytest.mark.parametrize("resumable", [True, False])
def test_only_a_resumable_stream_keeps_the_clients_body(resumable: bool) -> None:
    body = orjson.dumps(REQUEST)
    tracker = StreamTracker(chat=True, client_ids=False, include_usage=False)
    c = call()
    c.accept(body, RequestInfo("m", True, None, ""), None, tracker if resumable else None, body)
    assert c.send_body is body  # the first attempt's
    if resumable:
        assert c.body is body and c.requested() == REQUEST
    else:
        assert c.body == b""
