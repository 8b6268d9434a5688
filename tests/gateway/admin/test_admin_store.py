"""The admin state file: round trips, schema versioning, and clear errors for bad files."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from gateway.admin.errors import AdminStartError
from gateway.admin.state import AddedUnit, Mark, Removal
from gateway.admin.store import SCHEMA_VERSION, Store, StoreError


async def test_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite3"
    store = await Store.open(path)
    await store.set_mark("u0", Mark("disabled", "disk", "alice", 1.5))
    await store.set_mark("u1", Mark("draining", "", "bob", 2.0))
    await store.set_mark("u1", None)  # back to as configured
    await store.add("u9", AddedUnit({"id": "u9", "leader": "http://h:1"}, "bob", 3.0))
    await store.add("u8", AddedUnit({"id": "u8", "leader": "http://h:2"}, "bob", 3.0))
    await store.set_mark("u8", Mark("disabled", "new", "bob", 4.0))
    await store.remove("u8", None)  # a runtime unit: forgotten, mark and all
    await store.remove("u2", Removal("alice", 5.0))  # a config unit: remembered as removed
    await store.close()

    store = await Store.open(path)
    saved = await store.load()
    await store.close()
    assert saved.marks == {"u0": Mark("disabled", "disk", "alice", 1.5)}
    assert saved.added == {"u9": AddedUnit({"id": "u9", "leader": "http://h:1"}, "bob", 3.0)}
    assert saved.removed == {"u2": Removal("alice", 5.0)}


async def test_schema_is_versioned(tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite3"
    await (await Store.open(path)).close()
    with sqlite3.connect(path) as db:
        row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        assert row == (str(SCHEMA_VERSION),)
        db.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    db.close()
    with pytest.raises(AdminStartError, match=r"state\.sqlite3: unusable: schema version 99"):
        await Store.open(path)


async def test_relative_path_resolves_against_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    store = await Store.open("rel.sqlite3")
    await store.close()
    assert store.path == tmp_path / "rel.sqlite3"
    assert store.path.exists()


@pytest.mark.parametrize(
    "content", [b"garbage, not SQLite" * 50, b"SQLite format 3\x00" + b"\xff" * 200]
)
async def test_corrupt_file_names_the_file(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "broken.sqlite3"
    path.write_bytes(content)
    with pytest.raises(AdminStartError, match=r"\[admin\]\.state_file .*broken\.sqlite3"):
        await Store.open(path)


async def test_bad_rows_are_a_start_error(tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite3"
    await (await Store.open(path)).close()
    with sqlite3.connect(path) as db:
        db.execute("INSERT INTO marks VALUES ('u0', 'sideways', '', 'x', 0)")
    db.close()
    store = await Store.open(path)
    with pytest.raises(AdminStartError, match="unknown admin state 'sideways'"):
        await store.load()
    await store.close()


async def test_missing_directory_is_a_start_error(tmp_path: Path) -> None:
    with pytest.raises(AdminStartError, match="no/such/dir"):
        await Store.open(tmp_path / "no" / "such" / "dir" / "state.sqlite3")


async def test_failed_write_is_a_store_error(tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite3"
    store = await Store.open(path)
    with sqlite3.connect(path) as db:
        db.execute("DROP TABLE marks")
    db.close()
    with pytest.raises(StoreError, match=r"cannot save admin state to .*state\.sqlite3"):
        await store.set_mark("u0", Mark("disabled", "x", "y", 0.0))
    await store.close()
