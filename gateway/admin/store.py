"""Admin overrides on disk (SQLite), so a restart does not silently put a disabled unit back.

SQLite because a half-written JSON file after a crash would lose every override, while a
SQLite transaction is all or nothing. The stdlib driver blocks, so every call runs in a worker
thread; one connection and one lock serialize them, which is plenty for operator actions.
The schema is versioned in `meta` so a newer gateway can migrate and an older one refuses a
file it does not understand instead of misreading it. Version 2 added the data-plane API keys
(`keys`: one JSON record per key, its secret's hash and never the secret); version 3 the
rollouts (`rollouts`: one JSON record each, the running one and those before it) and the
revision each cell serves once a rollout changed it (`cells`). Older files are migrated when
opened.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import orjson

from gateway.admin.errors import AdminStartError
from gateway.admin.state import AddedUnit, Mark, Removal, Saved, saved_mark
from gateway.auth.keys import Key, from_record

SCHEMA_VERSION = 3
_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS marks (
    unit TEXT PRIMARY KEY, state TEXT NOT NULL, reason TEXT NOT NULL,
    who TEXT NOT NULL, since REAL NOT NULL);
CREATE TABLE IF NOT EXISTS added (
    unit TEXT PRIMARY KEY, config TEXT NOT NULL, who TEXT NOT NULL, since REAL NOT NULL);
CREATE TABLE IF NOT EXISTS removed (unit TEXT PRIMARY KEY, who TEXT NOT NULL, since REAL NOT NULL);
"""
# Each version's step from the one before; tables it adds are in _SCHEMA (IF NOT EXISTS).
_MIGRATIONS = {
    2: ("CREATE TABLE IF NOT EXISTS keys (id TEXT PRIMARY KEY, record TEXT NOT NULL);",),
    3: (
        "CREATE TABLE IF NOT EXISTS rollouts ("
        "id TEXT PRIMARY KEY, started REAL NOT NULL, record TEXT NOT NULL);",
        "CREATE TABLE IF NOT EXISTS cells (cell TEXT PRIMARY KEY, revision TEXT NOT NULL);",
    ),
}

T = TypeVar("T")


class StoreError(RuntimeError):
    """A write failed: the admin action is refused rather than applied but forgotten."""


class Store:
    def __init__(self, path: Path, connection: sqlite3.Connection) -> None:
        self.path = path
        self._db = connection
        self._lock = asyncio.Lock()

    @classmethod
    async def open(cls, path: str | Path) -> Store:
        """Open (creating if missing) and check the file; AdminStartError names it if unusable."""
        resolved = Path.cwd() / path  # relative paths resolve against the working directory
        try:
            db = await asyncio.to_thread(_connect, resolved)
        except (sqlite3.Error, ValueError) as exc:
            raise AdminStartError(f"[admin].state_file {resolved}: unusable: {exc}") from None
        return cls(resolved, db)

    async def load(self) -> Saved:
        try:
            return await self._run(_load)
        except (sqlite3.Error, ValueError, KeyError, TypeError) as exc:
            raise AdminStartError(f"[admin].state_file {self.path}: unreadable: {exc}") from None

    async def set_mark(self, unit: str, mark: Mark | None) -> None:
        """Record the unit's admin state; None means "as configured" (nothing to override)."""
        if mark is None:
            await self._write("DELETE FROM marks WHERE unit = ?", (unit,))
        else:
            await self._write(
                "INSERT OR REPLACE INTO marks VALUES (?, ?, ?, ?, ?)",
                (unit, mark.state, mark.reason, mark.who, mark.since),
            )

    async def add(self, unit: str, added: AddedUnit) -> None:
        config = orjson.dumps(added.config).decode()
        await self._write(
            "INSERT OR REPLACE INTO added VALUES (?, ?, ?, ?)",
            (unit, config, added.who, added.since),
        )

    async def remove(self, unit: str, configured: Removal | None) -> None:
        """Forget a runtime-added unit; for a unit of the config file remember that it is gone."""

        def apply(db: sqlite3.Connection) -> None:
            with db:
                db.execute("DELETE FROM added WHERE unit = ?", (unit,))
                db.execute("DELETE FROM marks WHERE unit = ?", (unit,))
                if configured is not None:
                    db.execute(
                        "INSERT OR REPLACE INTO removed VALUES (?, ?, ?)",
                        (unit, configured.who, configured.since),
                    )

        await self._guarded(apply)

    async def put_key(self, key: Key) -> None:
        """A key made, or changed (revoked)."""
        record = orjson.dumps(key.record()).decode()
        await self._write("INSERT OR REPLACE INTO keys VALUES (?, ?)", (key.id, record))

    async def put_rollout(self, rollout: str, started: float, record: dict[str, Any]) -> None:
        """A rollout's record as it is now (written at every step, verdict and end)."""
        text = orjson.dumps(record).decode()
        await self._write(
            "INSERT OR REPLACE INTO rollouts VALUES (?, ?, ?)", (rollout, started, text)
        )

    async def set_serving(self, serving: dict[str, str]) -> None:
        """The revision each cell serves, after a rollout moved them."""

        def apply(db: sqlite3.Connection) -> None:
            with db:
                db.execute("DELETE FROM cells")
                db.executemany("INSERT INTO cells VALUES (?, ?)", sorted(serving.items()))

        await self._guarded(apply)

    async def close(self) -> None:
        async with self._lock:
            await asyncio.to_thread(self._db.close)

    async def _write(self, sql: str, params: tuple[Any, ...]) -> None:
        def apply(db: sqlite3.Connection) -> None:
            with db:
                db.execute(sql, params)

        await self._guarded(apply)

    async def _guarded(self, fn: Callable[[sqlite3.Connection], None]) -> None:
        try:
            await self._run(fn)
        except sqlite3.Error as exc:
            raise StoreError(f"cannot save admin state to {self.path}: {exc}") from None

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        async with self._lock:
            return await asyncio.to_thread(fn, self._db)


def _connect(path: Path) -> sqlite3.Connection:
    db = sqlite3.connect(path, timeout=5.0, check_same_thread=False)
    try:
        with db:
            db.executescript(_SCHEMA)
            row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
            if row is None:
                _migrate(db, 1)  # a new file
                db.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
            elif not row[0].isdigit() or not 1 <= int(row[0]) <= SCHEMA_VERSION:
                raise ValueError(
                    f"schema version {row[0]}, this gateway understands 1 to {SCHEMA_VERSION}"
                )
            elif int(row[0]) < SCHEMA_VERSION:
                _migrate(db, int(row[0]))
                db.execute(
                    "UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION),)
                )
    except BaseException:
        db.close()
        raise
    return db


def _migrate(db: sqlite3.Connection, found: int) -> None:
    """From schema version `found` to SCHEMA_VERSION, in the caller's transaction."""
    for version in range(found + 1, SCHEMA_VERSION + 1):
        for statement in _MIGRATIONS[version]:
            db.execute(statement)


def _load(db: sqlite3.Connection) -> Saved:
    saved = Saved()
    for unit, state, reason, who, since in db.execute("SELECT * FROM marks"):
        saved.marks[unit] = saved_mark(unit, state, reason, who, since)
    for unit, config, who, since in db.execute("SELECT * FROM added"):
        saved.added[unit] = AddedUnit(orjson.loads(config), who, float(since))
    for unit, who, since in db.execute("SELECT * FROM removed"):
        saved.removed[unit] = Removal(who, float(since))
    for _, record in db.execute("SELECT * FROM keys"):
        key = from_record(orjson.loads(record))
        saved.keys[key.id] = key
    for rollout, _, record in db.execute("SELECT * FROM rollouts ORDER BY started"):
        saved.rollouts[rollout] = orjson.loads(record)
    for cell, revision in db.execute("SELECT * FROM cells"):
        saved.serving[cell] = revision
    return saved
