"""The erasure and export log, in the state database (``serve.statedb``: SQLite or PostgreSQL).

A row per erasure and per export: tenant, the user's hash (never the user id once done), the
requesting key's id, status, counts per store, times. An erasure in progress keeps the user's
stored key (it is what a restart resumes the work with) and clears it in the same transaction
that marks it ``done``; then :meth:`~recallserve.serve.statedb.Database.release_erased` drops the
old row version (SQLite: the WAL is truncated; PostgreSQL: ``VACUUM FULL erasures``), so the log
holds no erased id afterwards.

Where the log lives: without a state DSN, in ``erasures.sqlite3`` of the ``state`` deployment
(one replica, reached through a handle by every ingress replica); with one, in the PostgreSQL
table ``erasures`` that every ingress replica reaches through its own pool. Either way there is
one log per cluster, so ``GET /v1/erasures/{id}`` answers on any replica.

Runs are leased so that an unfinished erasure is run by one replica at a time: :meth:`ErasureLog.claim`
sets ``runner`` and ``lease_until`` (now + ``lease_s``) when the row is unleased, its lease ran
out, or the caller already holds it; a run renews it before each pass. A replica that dies
mid-run leaves a lease that runs out, and the next replica polling :meth:`ErasureLog.unfinished`
claims it. Under PostgreSQL two concurrent claims are SERIALIZABLE transactions: one sees the
other's lease. NOTE: leases compare the replicas' wall clocks; a skew shorter than ``lease_s``
(seconds) only delays a take-over.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import Field

from recallserve.kernels import StrictModel
from recallserve.serve.statedb import Connection, Database, SqliteDatabase

__all__ = ["ErasureLog", "ErasureRow", "ErasureStatus", "MAX_LIST", "PG_MIGRATIONS", "TABLES"]

_T = TypeVar("_T")
ErasureStatus = Literal["pending", "done", "failed"]
#: Most rows one list call returns.
MAX_LIST = 500
#: The log's tables (what an erasure's release step rewrites).
TABLES: tuple[str, ...] = ("erasures",)

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS erasures (
        id TEXT PRIMARY KEY, kind TEXT NOT NULL, tenant TEXT NOT NULL, user_key TEXT, user_hash TEXT NOT NULL,
        requester TEXT NOT NULL, status TEXT NOT NULL, attempts INTEGER NOT NULL DEFAULT 0, counts TEXT NOT NULL,
        error TEXT, created_at REAL NOT NULL, done_at REAL, runner TEXT, lease_until REAL)""",
    "CREATE INDEX IF NOT EXISTS erasures_tenant ON erasures (tenant, created_at)",
)
#: PostgreSQL schema versions of the log, oldest first (append; never edit a shipped one).
PG_MIGRATIONS: tuple[str, ...] = (
    """
CREATE TABLE erasures (
    id TEXT PRIMARY KEY, kind TEXT NOT NULL, tenant TEXT NOT NULL, user_key TEXT, user_hash TEXT NOT NULL,
    requester TEXT NOT NULL, status TEXT NOT NULL, attempts INTEGER NOT NULL DEFAULT 0, counts TEXT NOT NULL,
    error TEXT, created_at DOUBLE PRECISION NOT NULL, done_at DOUBLE PRECISION, runner TEXT,
    lease_until DOUBLE PRECISION
);
CREATE INDEX erasures_tenant ON erasures (tenant, created_at);
""",
)


def _sqlite_schema(conn: Connection) -> None:
    for stmt in _SCHEMA:
        conn.execute(stmt)
    # NOTE: a log file written before runs were leased lacks the two lease columns.
    have = {r[1] for r in conn.execute("PRAGMA table_info(erasures)").fetchall()}
    for column, kind in (("runner", "TEXT"), ("lease_until", "REAL")):
        if column not in have:
            conn.execute(f"ALTER TABLE erasures ADD COLUMN {column} {kind}")


class ErasureRow(StrictModel):
    """One logged erasure or export (what ``GET /v1/erasures/{id}`` and the console show)."""

    object: Literal["erasure", "export"] = Field(description="What was done.")
    id: str = Field(description="Erasure id.")
    tenant: str = Field(description="Tenant.")
    user_hash: str = Field(description="blake2b of tenant and user key (the log never keeps the user id).")
    requester: str = Field(description="Id of the API key that asked (a hash, never the key).")
    status: ErasureStatus = Field(description="pending, done (every copy gone) or failed (retried).")
    attempts: int = Field(description="Runs started (a restart resumes a pending erasure).")
    counts: dict[str, int] = Field(description="Items removed (or exported) per store.")
    error: str | None = Field(default=None, description="Why the last run failed (no content).")
    created_at: float = Field(description="Requested, epoch seconds.")
    done_at: float | None = Field(default=None, description="Finished, epoch seconds.")


def _row(r: Any) -> ErasureRow:
    return ErasureRow(object=r["kind"], id=r["id"], tenant=r["tenant"], user_hash=r["user_hash"],
                      requester=r["requester"], status=r["status"], attempts=r["attempts"],
                      counts=json.loads(r["counts"]), error=r["error"], created_at=r["created_at"],
                      done_at=r["done_at"])


class ErasureLog:
    """The log in the state database; every public method is a coroutine (one short transaction).

    Args:
        path: SQLite file when ``db`` is None (``synchronous=FULL``: an acknowledged erasure request
            must survive a power loss, it is resumed).
        db: an open state database to use instead (the PostgreSQL one the other state stores share);
            its owner closes it.
    """

    def __init__(self, path: str | Path | None = None, *, db: Database | None = None) -> None:
        if db is None:
            if path is None:
                raise ValueError("ErasureLog: give path or db")
            db = SqliteDatabase(path, synchronous="FULL")
            self._owns_db = True
        else:
            self._owns_db = False
        self.db = db
        db.ensure_schema("erasures", _sqlite_schema, PG_MIGRATIONS)

    async def _call(self, fn: Callable[[Connection], _T], write: bool = True) -> _T:
        return await self.db.call(fn, write)

    def close(self) -> None:
        """Close the database when this log opened it."""
        if self._owns_db:
            self.db.close()

    async def begin(self, tenant: str, user_key: str | None, user_hash: str, requester: str) -> tuple[ErasureRow, bool]:
        """The pending erasure of (tenant, user), or a new one; ``(row, created)``. Idempotent: a
        second request while one is pending returns the same id (on any replica: one log)."""

        def fn(conn: Connection) -> tuple[ErasureRow, bool]:
            r = conn.execute("SELECT * FROM erasures WHERE kind = 'erasure' AND tenant = ? AND user_hash = ? "
                             "AND status != 'done' ORDER BY created_at LIMIT 1", (tenant, user_hash)).fetchone()
            if r is not None:
                return _row(r), False
            eid = "er_" + uuid.uuid4().hex
            conn.execute("INSERT INTO erasures (id, kind, tenant, user_key, user_hash, requester, status, counts, "
                         "created_at) VALUES (?, 'erasure', ?, ?, ?, ?, 'pending', '{}', ?)",
                         (eid, tenant, user_key, user_hash, requester, time.time()))
            return _row(conn.execute("SELECT * FROM erasures WHERE id = ?", (eid,)).fetchone()), True

        return await self._call(fn)

    async def claim(self, erasure_id: str, runner: str, lease_s: float, *, count: bool = True) -> bool:
        """Lease the unfinished erasure to ``runner`` for ``lease_s`` seconds; False when another
        runner holds an unexpired lease or it is done. ``count``: this starts a run (``attempts`` + 1)."""
        now = time.time()
        step = 1 if count else 0
        return bool(await self._call(lambda c: c.execute(
            "UPDATE erasures SET runner = ?, lease_until = ?, attempts = attempts + ? WHERE id = ? "
            "AND kind = 'erasure' AND status != 'done' AND (runner IS NULL OR runner = ? OR lease_until < ?)",
            (runner, now + lease_s, step, erasure_id, runner, now)).rowcount))

    async def finish(self, erasure_id: str, counts: dict[str, int]) -> None:
        """Mark it done, forget the user key and the lease, then drop the old row version that held
        the key (:meth:`Database.release_erased`)."""
        await self._call(lambda c: c.execute(
            "UPDATE erasures SET status = 'done', user_key = NULL, error = NULL, runner = NULL, lease_until = NULL, "
            "counts = ?, done_at = ? WHERE id = ?", (json.dumps(counts), time.time(), erasure_id)))
        await asyncio.to_thread(self.db.release_erased, TABLES)

    async def fail(self, erasure_id: str, error: str) -> None:
        """Record why a run failed (it stays to be resumed; ``status`` says ``failed``; the lease is kept:
        the same runner retries)."""
        await self._call(lambda c: c.execute("UPDATE erasures SET status = 'failed', error = ? WHERE id = ?",
                                             (error[:500], erasure_id)))

    async def exported(self, tenant: str, user_hash: str, requester: str, counts: dict[str, int]) -> ErasureRow:
        """Log an export (done when logged: the stream was written)."""
        eid = "ex_" + uuid.uuid4().hex
        now = time.time()

        def fn(conn: Connection) -> ErasureRow:
            conn.execute("INSERT INTO erasures (id, kind, tenant, user_key, user_hash, requester, status, counts, "
                         "created_at, done_at) VALUES (?, 'export', ?, NULL, ?, ?, 'done', ?, ?, ?)",
                         (eid, tenant, user_hash, requester, json.dumps(counts), now, now))
            return _row(conn.execute("SELECT * FROM erasures WHERE id = ?", (eid,)).fetchone())

        return await self._call(fn)

    async def erased_since(self, tenant: str, user_hashes: tuple[str, ...], since: float) -> bool:
        """Whether an erasure of any of ``user_hashes`` in ``tenant`` was requested at or after
        ``since`` (epoch seconds): a turn that started before it must not store what it produced."""
        marks = ", ".join("?" for _ in user_hashes)
        return await self._call(lambda c: c.execute(
            f"SELECT 1 FROM erasures WHERE tenant = ? AND kind = 'erasure' AND created_at >= ? "
            f"AND user_hash IN ({marks}) LIMIT 1", (tenant, since, *user_hashes)).fetchone(), write=False) is not None

    async def get(self, tenant: str | None, erasure_id: str) -> ErasureRow | None:
        """One row of ``tenant`` (another tenant's id reads as absent); None: of any tenant (an admin key)."""
        where, args = ("id = ?", (erasure_id,)) if tenant is None else ("tenant = ? AND id = ?", (tenant, erasure_id))
        r = await self._call(lambda c: c.execute(f"SELECT * FROM erasures WHERE {where}", args).fetchone(),
                             write=False)
        return None if r is None else _row(r)

    async def unfinished(self) -> list[tuple[ErasureRow, str | None]]:
        """Every erasure not done (all tenants) with its user key (None: the whole tenant), oldest first."""
        rows = await self._call(lambda c: c.execute(
            "SELECT * FROM erasures WHERE kind = 'erasure' AND status != 'done' ORDER BY created_at LIMIT ?",
            (MAX_LIST,)).fetchall(), write=False)
        return [(_row(r), r["user_key"]) for r in rows]

    async def recent(self, tenant: str | None, limit: int = 50) -> list[ErasureRow]:
        """Newest rows of ``tenant`` (None: every tenant, for the operator), newest first."""
        where, args = ("", ()) if tenant is None else ("WHERE tenant = ?", (tenant,))
        rows = await self._call(lambda c: c.execute(
            f"SELECT * FROM erasures {where} ORDER BY created_at DESC LIMIT ?",
            (*args, max(1, min(limit, MAX_LIST)))).fetchall(), write=False)
        return [_row(r) for r in rows]
