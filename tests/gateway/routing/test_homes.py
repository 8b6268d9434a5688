"""Which unit holds which stored response: bounded, expiring, on a fake clock; and the ids
read from a Responses answer, whole or streamed."""

from __future__ import annotations

import pytest

from gateway.proxy.stored import response_id, target
from gateway.routing.homes import Homes


def test_a_home_is_kept_for_its_ttl_after_its_last_use() -> None:
    homes: Homes[str] = Homes(limit=10, ttl=5.0)
    homes.learn("resp_a", "u0", now=0.0)
    assert homes.get("resp_a", now=4.9) == "u0"  # used: kept 5 s from now
    assert homes.get("resp_a", now=9.8) == "u0"
    assert homes.get("resp_a", now=14.8) is None  # 5 s unused
    assert len(homes) == 0 and homes.get("resp_b", now=0.0) is None


def test_the_least_recently_used_home_goes_first() -> None:
    homes: Homes[str] = Homes(limit=2, ttl=60.0)
    homes.learn("a", "u0", 0.0)
    homes.learn("b", "u1", 1.0)
    assert homes.get("a", 2.0) == "u0"  # now b is the oldest used
    homes.learn("c", "u1", 3.0)
    assert (homes.get("a", 4.0), homes.get("b", 4.0), homes.get("c", 4.0)) == ("u0", None, "u1")
    nothing: Homes[str] = Homes(limit=0, ttl=60.0)  # remembering off: every id is looked for
    nothing.learn("a", "u0", 0.0)
    assert nothing.get("a", 0.0) is None


@pytest.mark.parametrize(
    ("first", "content_type", "found"),
    [
        (b'{"id": "resp_1", "object": "response"}', "application/json", "resp_1"),
        (
            b'event: response.created\ndata: {"type": "response.created", "response": '
            b'{"id": "resp_2"}}\n\nevent: response.in_progress\ndata: {}',
            "text/event-stream; charset=utf-8",
            "resp_2",
        ),
        (b'data: {"response": {"id": "resp_3"}}', "text/event-stream", "resp_3"),  # no \n yet
        (b'{"error": {"message": "no"}}', "application/json", None),
        (b'{"id": 7}', "application/json", None),
        (b"[1, 2]", "application/json", None),
        (b"event: ping\n\n", "text/event-stream", None),
        (b'data: {"response": "x"}\n', "text/event-stream", None),
        (b"data: {cut", "text/event-stream", None),  # the first event cut: looked for later
    ],
)
def test_the_id_a_responses_answer_carries(first: bytes, content_type: str, found: str) -> None:
    assert response_id(first, content_type) == found


def test_an_id_is_one_path_segment_on_the_unit() -> None:
    assert target("resp_1") == "/v1/responses/resp_1"
    assert target("a/../b c", "/cancel") == "/v1/responses/a%2F..%2Fb%20c/cancel"
    assert target("resp_1", query="stream=true&starting_after=3") == (
        "/v1/responses/resp_1?stream=true&starting_after=3"
    )
