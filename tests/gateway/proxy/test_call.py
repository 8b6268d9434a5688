"""What a call keeps of its request once intake accepted it: thousands of streams stay open at
once and a long prompt is most of a request, so neither the client's body nor its parsed form
is kept; a resumable stream keeps only what its continuation would take (continuation.carried,
tested in test_tracker.py), and the body sent to the unit goes once the unit answered
(test_dispatch.py)."""

from __future__ import annotations

import orjson

from gateway.paths import CHAT_PATH
from gateway.proxy.call import Call
from gateway.proxy.continuation import carried, with_token_ids
from gateway.proxy.lease import Lease
from gateway.proxy.validation import RequestInfo
from gateway.relay.tracker import StreamTracker
from gateway.routing.admission import Admission

REQUEST = {
    "model": "m",
    "messages": [{"role": "user", "content": "a long prompt " * 500}],
    "stream": True,
    "temperature": 0.0,
    "max_tokens": 64,
}


def test_a_resumable_call_keeps_what_its_continuation_takes_and_not_the_request() -> None:
    c = Call(CHAT_PATH, "r1", {}, 0.0, 60.0, Lease(Admission(8, 1.0, 1)))
    tracker = StreamTracker(chat=True, client_ids=False, include_usage=False)
    send = with_token_ids(REQUEST)
    c.accept(RequestInfo("m", True, None, ""), None, tracker, send, carried(REQUEST))
    assert c.send_body is send and c.tracker is tracker
    assert c.carried == {"temperature": 0.0, "max_tokens": 64}
    assert len(orjson.dumps(c.carried)) < 50 and len(send) > 7000
    assert not hasattr(c, "body") and not hasattr(c, "data")  # no slot for either
