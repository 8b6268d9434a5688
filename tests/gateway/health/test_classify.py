"""The breaker's classifier: what counts against a unit, and what the gateway did itself."""

from __future__ import annotations

import pytest

from gateway.health.classify import Evidence, attempt_failure, stream_end
from gateway.outcomes import End, Failure

IDLE, PACE = 30.0, 4.0


@pytest.mark.parametrize("kind", [End.RESET, End.TRUNCATED, End.UNIT_ERROR])
def test_breaks_the_unit_caused_are_failures(kind: End) -> None:
    assert stream_end(kind, 0.02, IDLE, PACE) is Evidence.FAILURE


@pytest.mark.parametrize(
    "kind", [End.UNIT_EJECTED, End.CLIENT_GONE, End.TOTAL_TIMEOUT, End.SHUTDOWN]
)
def test_breaks_the_gateway_caused_say_nothing_about_the_unit(kind: End) -> None:
    assert stream_end(kind, 0.02, IDLE, PACE) is Evidence.NONE


def test_a_complete_stream_is_a_success() -> None:
    assert stream_end(End.COMPLETE, None, IDLE, PACE) is Evidence.OK


def test_an_idle_timeout_counts_unless_the_streams_own_pace_explains_it() -> None:
    idle = End.IDLE_TIMEOUT
    assert stream_end(idle, 0.02, IDLE, PACE) is Evidence.FAILURE  # 20 ms tokens
    assert stream_end(idle, None, IDLE, PACE) is Evidence.FAILURE  # never paced
    assert stream_end(idle, 7.4, IDLE, PACE) is Evidence.FAILURE  # 29.6 s < 30 s
    assert stream_end(idle, 7.5, IDLE, PACE) is Evidence.NONE  # that slow by nature


@pytest.mark.parametrize("kind", [Failure.FIRST_BYTE_TIMEOUT, Failure.CONNECT_TIMEOUT])
def test_a_timeout_before_the_first_byte_is_load_while_the_units_streams_flow(
    kind: Failure,
) -> None:
    assert attempt_failure(kind, flowing=True) is Evidence.NONE
    assert attempt_failure(kind, flowing=False) is Evidence.FAILURE


@pytest.mark.parametrize("kind", [Failure.CONNECT, Failure.RESET, Failure.STATUS, Failure.PROTOCOL])
def test_other_attempt_failures_count_whatever_flows(kind: Failure) -> None:
    assert attempt_failure(kind, flowing=True) is Evidence.FAILURE


def test_the_gateways_own_resources_running_out_is_not_the_units_fault() -> None:
    assert attempt_failure(Failure.LOCAL, flowing=False) is Evidence.NONE


def test_every_end_has_a_message_for_the_client() -> None:
    for end in End:
        if end not in (End.COMPLETE, End.CLIENT_GONE):
            assert end.message != end.value
