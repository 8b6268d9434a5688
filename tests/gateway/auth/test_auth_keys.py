"""API keys without I/O: a new key's body checked field by field, a header looked up, and the
request path's answer with `[auth] required` on and off."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.auth.caller import ANONYMOUS, Caller
from gateway.auth.check import Gatekeeper, Unauthorized, identify
from gateway.auth.keys import Key, digest, from_record, new_secret, shown
from gateway.auth.ring import KeyRing
from gateway.auth.spec import SpecError, class_names, parse
from gateway.config import Config, config_from_dict
from gateway.config.auth import AuthConfig
from gateway.config.priority import PriorityConfig

NOW = 1_800_000_000.0
CONFIG = Config()


def key(secret: str, **fields: Any) -> Key:
    values: dict[str, Any] = {
        "id": "key_000000000001", "hash": digest(secret), "prefix": shown(secret),
        "tenant": "acme", "priority": "standard", "default_priority": "standard", "rpm": 60,
        "tpm": None, "max_inflight": 4, "expires": None, "created": NOW - 10, "who": "alice",
    }  # fmt: skip
    return Key(**{**values, **fields})


def ring_of(*keys: Key) -> KeyRing:
    ring = KeyRing()
    ring.replace(keys)
    return ring


def test_a_secret_is_long_random_and_shown_only_by_its_prefix() -> None:
    a, b = new_secret(), new_secret()
    assert a != b and a.startswith("ug-") and len(a) >= 40
    assert shown(a) == a[:7] + "…"
    assert len(digest(a)) == 64


def test_a_minimal_body_takes_the_default_class_and_no_limits() -> None:
    made = parse({"tenant": "acme"}, CONFIG, NOW)
    assert (made.tenant, made.priority, made.default_priority) == ("acme", "standard", "standard")
    assert (made.rpm, made.tpm, made.max_inflight, made.expires) == (None, None, None, None)


def test_a_full_body() -> None:
    body = {"tenant": "a.b-c_1", "priority": "Standard", "rpm": 60, "tpm": 10_000,
            "max_inflight": 2, "expires": "2030-01-01T00:00:00Z"}  # fmt: skip
    made = parse(body, CONFIG, NOW)
    assert made.priority == "standard" and made.rpm == 60 and made.max_inflight == 2
    assert made.expires == 1893456000.0
    assert parse({"tenant": "t", "expires": NOW + 60}, CONFIG, NOW).expires == NOW + 60


@pytest.mark.parametrize(
    ("body", "names"),
    [
        ([], "JSON object"),
        ({}, "[body].tenant"),
        ({"tenant": ""}, "[body].tenant"),
        ({"tenant": "a b"}, "[body].tenant"),
        ({"tenant": "x" * 65}, "[body].tenant"),
        ({"tenant": "anonymous"}, "[body].tenant"),
        ({"tenant": "t", "colour": 1}, "unknown key [body].colour"),
        ({"tenant": "t", "priority": "gold"}, "[body].priority"),
        ({"tenant": "t", "default_priority": 3}, "[body].default_priority"),
        ({"tenant": "t", "rpm": -1}, "[body].rpm"),
        ({"tenant": "t", "tpm": 0}, "[body].tpm"),
        ({"tenant": "t", "max_inflight": 1.5}, "[body].max_inflight"),
        ({"tenant": "t", "rpm": True}, "[body].rpm"),
        ({"tenant": "t", "rpm": "60"}, "[body].rpm"),
        ({"tenant": "t", "rpm": 2**60}, "[body].rpm"),
        ({"tenant": "t", "expires": NOW - 1}, "in the past"),
        ({"tenant": "t", "expires": "2001-01-01T00:00:00+00:00"}, "in the past"),
        ({"tenant": "t", "expires": "tomorrow"}, "[body].expires"),
        ({"tenant": "t", "expires": "2030-01-01T00:00:00"}, "offset"),
        ({"tenant": "t", "expires": [1]}, "[body].expires"),
    ],
)
def test_a_bad_body_is_refused_naming_the_field(body: object, names: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse(body, CONFIG, NOW)
    assert names in str(caught.value)


class _WithClasses:
    """A config with [priority] (Config gains the section on merge with the lead's branch)."""

    priority = PriorityConfig()


def test_classes_come_from_the_priority_config_when_there_is_one() -> None:
    config: Any = _WithClasses()
    assert class_names(CONFIG) == ("standard",)
    assert class_names(config) == ("interactive", "standard", "batch")
    made = parse({"tenant": "t", "priority": "interactive"}, config, NOW)
    assert (made.priority, made.default_priority) == ("interactive", "interactive")
    made = parse(
        {"tenant": "t", "priority": "interactive", "default_priority": "batch"}, config, NOW
    )
    assert made.default_priority == "batch"
    with pytest.raises(SpecError, match="ranks above"):
        parse({"tenant": "t", "priority": "batch", "default_priority": "standard"}, config, NOW)


def test_identify_names_each_reason_without_echoing_the_key() -> None:
    good, revoked, expired = new_secret(), new_secret(), new_secret()
    ring = ring_of(
        key(good),
        key(revoked, id="key_2", hash=digest(revoked), revoked=NOW - 1, revoked_by="bob"),
        key(expired, id="key_3", hash=digest(expired), expires=NOW - 1),
    )
    caller = identify(f"Bearer {good}", ring, NOW)
    assert caller == Caller("acme", "key_000000000001", "standard", "standard", 60, None, 4)
    assert identify(f"bearer   {good}  ", ring, NOW) == caller
    cases = {
        None: "Missing API key",
        "": "Missing API key",
        good: "Malformed",
        f"Basic {good}": "Malformed",
        "Bearer": "Malformed",
        f"Bearer {good} extra": "Malformed",
        "Bearer EMPTY": "Incorrect API key",
        f"Bearer {revoked}": "revoked",
        f"Bearer {expired}": "expired",
    }
    for header, reason in cases.items():
        found = identify(header, ring, NOW)
        assert isinstance(found, str) and reason in found, (header, found)
        assert good not in found and revoked not in found and expired not in found


def test_not_required_anything_but_a_valid_key_is_anonymous() -> None:
    secret = new_secret()
    gate = Gatekeeper(AuthConfig(required=False), ring_of(key(secret)), clock=lambda: NOW)
    assert gate.caller(f"Bearer {secret}").tenant == "acme"
    for header in (None, "Bearer EMPTY", "garbled"):
        assert gate.caller(header) is ANONYMOUS
    assert Gatekeeper(AuthConfig(), KeyRing()).caller("Bearer x") is ANONYMOUS


def test_required_refuses_with_openai_shaped_401() -> None:
    gate = Gatekeeper(AuthConfig(required=True), KeyRing(), clock=lambda: NOW)
    with pytest.raises(Unauthorized) as caught:
        gate.caller("Bearer sk-not-a-key")
    response = caught.value.response()
    assert response.status == 401
    assert response.headers["WWW-Authenticate"] == "Bearer"
    error = caught.value
    assert (error.type, error.code) == ("invalid_request_error", "invalid_api_key")


def test_a_record_round_trips_and_a_view_has_no_hash() -> None:
    k = key(new_secret())
    assert from_record(k.record()) == k
    view = k.view(NOW)
    assert "hash" not in view and view["state"] == "active"
    assert k.revoke(NOW, "bob").view(NOW)["state"] == "revoked"
    with pytest.raises(TypeError):
        from_record({**k.record(), "surprise": 1})
    with pytest.raises(ValueError, match="not a key record"):
        from_record({**k.record(), "hash": "short"})


def test_the_ring_swaps_whole_tables_and_tells_its_listeners() -> None:
    ring, heard = KeyRing(), []
    ring.on_change(lambda r: heard.append(r.version))
    a = key(new_secret())
    ring.put(a)
    ring.put(a.revoke(NOW, "bob"))
    assert list(ring.by_id) == [a.id] and ring.by_id[a.id].revoked == NOW
    assert heard == [1, 2]


def test_required_auth_needs_the_admin_api() -> None:
    assert config_from_dict({"auth": {"required": True}}).auth.required
    with pytest.raises(ValueError, match=r"\[auth\] needs the admin API"):
        config_from_dict({"auth": {"required": True}, "admin": {"enabled": False}})


def test_the_gatekeeper_remembers_a_key_until_the_table_changes_or_it_expires() -> None:
    now = [NOW]
    good = new_secret()
    made = key(good, expires=NOW + 10)
    ring = ring_of(made)
    gate = Gatekeeper(AuthConfig(required=True), ring, lambda: now[0])
    header = f"Bearer {good}"
    first = gate.caller(header)
    assert gate.caller(header) is first  # remembered: the same caller, no new lookup
    now[0] = NOW + 11  # expired while remembered
    with pytest.raises(Unauthorized, match="has expired"):
        gate.caller(header)
    now[0] = NOW
    assert gate.caller(header).key_id == made.id
    ring.put(made.revoke(NOW, "alice"))  # a new table: nothing remembered survives it
    with pytest.raises(Unauthorized, match="has been revoked"):
        gate.caller(header)
