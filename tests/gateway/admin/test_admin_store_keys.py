"""API keys in the admin state file: saved as hashed records, and a version 1 file (from
before keys) opened, migrated to version 2 and its overrides kept."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from gateway.admin.state import Mark
from gateway.admin.store import SCHEMA_VERSION, Store
from gateway.auth.keys import Key, digest, new_secret, shown
from gateway.auth.ring import KeyRing
from gateway.units import UnitRegistry
from gateway.workers import state
from tests.support import gateway_config

V1_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE marks (unit TEXT PRIMARY KEY, state TEXT NOT NULL, reason TEXT NOT NULL,
    who TEXT NOT NULL, since REAL NOT NULL);
CREATE TABLE added (unit TEXT PRIMARY KEY, config TEXT NOT NULL, who TEXT NOT NULL,
    since REAL NOT NULL);
CREATE TABLE removed (unit TEXT PRIMARY KEY, who TEXT NOT NULL, since REAL NOT NULL);
INSERT INTO meta VALUES ('schema_version', '1');
INSERT INTO marks VALUES ('u0', 'disabled', 'disk', 'alice', 1.5);
"""


def a_key(key_id: str = "key_000000000001") -> tuple[Key, str]:
    secret = new_secret()
    key = Key(
        key_id, digest(secret), shown(secret), "acme", "standard", "standard", 60, None, None,
        None, 10.0, "alice",
    )  # fmt: skip
    return key, secret


async def test_keys_round_trip_without_their_secrets(tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite3"
    store = await Store.open(path)
    key, secret = a_key()
    other, _ = a_key("key_000000000002")
    await store.put_key(key)
    await store.put_key(other)
    await store.put_key(key.revoke(20.0, "bob"))
    await store.close()
    assert secret.encode() not in path.read_bytes()
    store = await Store.open(path)
    saved = await store.load()
    await store.close()
    assert saved.keys == {key.id: key.revoke(20.0, "bob"), other.id: other}


async def test_a_version_1_file_is_migrated_and_keeps_its_overrides(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite3"
    with sqlite3.connect(path) as db:
        db.executescript(V1_SCHEMA)
    db.close()
    store = await Store.open(path)
    saved = await store.load()
    assert saved.marks == {"u0": Mark("disabled", "disk", "alice", 1.5)}
    assert saved.keys == {}
    key, _ = a_key()
    await store.put_key(key)
    await store.close()
    with sqlite3.connect(path) as db:
        row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    db.close()
    assert row == (str(SCHEMA_VERSION),) == ("3",)
    store = await Store.open(path)  # a migrated file opens as any other
    assert (await store.load()).keys == {key.id: key}
    await store.close()


def test_a_worker_gets_the_key_table_only_when_it_changed() -> None:
    config = gateway_config([{"id": "u0", "leader": "http://127.0.0.1:9000", "nodes": []}])
    registry, ring, mirror = UnitRegistry(config), KeyRing(), KeyRing()
    key, _ = a_key()
    ring.put(key)
    first = state.encode(registry, 1, ring)
    assert all("hash" in r and r["id"] == key.id for r in first["keys"])
    state.apply_keys(mirror, first)
    assert dict(mirror.by_hash) == {key.hash: key}
    state.apply_keys(mirror, state.encode(registry, 2))  # no keys in it: the table stays
    assert dict(mirror.by_hash) == {key.hash: key}
    ring.put(key.revoke(5.0, "bob"))
    state.apply_keys(mirror, state.encode(registry, 3, ring))
    assert mirror.by_hash[key.hash].revoked == 5.0
