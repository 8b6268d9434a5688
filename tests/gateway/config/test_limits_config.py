"""`[limits]` settings: errors name the key and the value."""

from __future__ import annotations

import pytest

from gateway.config.checks import FieldError
from gateway.config.limits import LimitsConfig
from gateway.limits.decisions import KeyLimits


@pytest.mark.parametrize(
    ("changes", "key"),
    [
        ({"lease_share": 1.5}, "lease_share"),
        ({"lease_max_requests": -1}, "lease_max_requests"),
        ({"lease_max_tokens": -1}, "lease_max_tokens"),
        ({"flush_interval": 0.0}, "flush_interval"),
        ({"flush_interval": 1.0, "slots_ttl": 3.0}, "slots_ttl"),
    ],
)
def test_a_bad_setting_is_refused_naming_its_key_and_value(
    changes: dict[str, float], key: str
) -> None:
    with pytest.raises(FieldError) as caught:
        LimitsConfig(**changes)  # type: ignore[arg-type]
    assert caught.value.name == key
    assert caught.value.value == changes[key]


def test_the_defaults_are_valid_and_a_key_limit_must_be_a_positive_whole_number() -> None:
    LimitsConfig()
    assert not KeyLimits().any()
    with pytest.raises(ValueError, match="rpm = 0"):
        KeyLimits(rpm=0)
