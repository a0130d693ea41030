"""The erasure and export log: one SQLite file (stdlib ``sqlite3``, WAL, ``secure_delete``).

A row per erasure and per export: tenant, the user's hash (never the user id once done), the
requesting key's id, status, counts per store, times. An erasure in progress keeps the user's
stored key (it is what a restart resumes the work with) and clears it in the same transaction
that marks it ``done``; the WAL is then truncated, so the log holds no erased id afterwards.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Literal, TypeVar

from pydantic import Field

from recallserve.kernels import StrictModel
from recallserve.serve.statedb import checkpoint, connect

__all__ = ["ErasureLog", "ErasureRow", "ErasureStatus"]

_T = TypeVar("_T")
ErasureStatus = Literal["pending", "done", "failed"]
#: Most rows one list call returns.
MAX_LIST = 500

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS erasures (
        id TEXT PRIMARY KEY, kind TEXT NOT NULL, tenant TEXT NOT NULL, user_key TEXT, user_hash TEXT NOT NULL,
        requester TEXT NOT NULL, status TEXT NOT NULL, attempts INTEGER NOT NULL DEFAULT 0, counts TEXT NOT NULL,
        error TEXT, created_at REAL NOT NULL, done_at REAL)""",
    "CREATE INDEX IF NOT EXISTS erasures_tenant ON erasures (tenant, created_at)",
)


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


def _row(r: sqlite3.Row) -> ErasureRow:
    return ErasureRow(object=r["kind"], id=r["id"], tenant=r["tenant"], user_hash=r["user_hash"],
                      requester=r["requester"], status=r["status"], attempts=r["attempts"],
                      counts=json.loads(r["counts"]), error=r["error"], created_at=r["created_at"],
                      done_at=r["done_at"])


class ErasureLog:
    """The log in one SQLite file; every public method is a coroutine (one short transaction)."""

    def __init__(self, path: str | Path) -> None:
        # NOTE: FULL: an acknowledged erasure request must survive a power loss (it is resumed).
        self._conn = connect(path, synchronous="FULL")
        self._lock = threading.Lock()
        with self._lock:
            for stmt in _SCHEMA:
                self._conn.execute(stmt)

    def _locked(self, fn: Callable[[sqlite3.Connection], _T]) -> _T:
        with self._lock, self._conn:
            self._conn.execute("BEGIN IMMEDIATE")
            return fn(self._conn)

    async def _call(self, fn: Callable[[sqlite3.Connection], _T]) -> _T:
        return await asyncio.to_thread(self._locked, fn)

    def close(self) -> None:
        """Close the database."""
        with self._lock:
            self._conn.close()

    async def begin(self, tenant: str, user_key: str | None, user_hash: str, requester: str) -> tuple[ErasureRow, bool]:
        """The pending erasure of (tenant, user), or a new one; ``(row, created)``. Idempotent: a
        second request while one is pending returns the same id."""

        def fn(conn: sqlite3.Connection) -> tuple[ErasureRow, bool]:
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

    async def started(self, erasure_id: str) -> None:
        """Count a run of the erasure."""
        await self._call(lambda c: c.execute("UPDATE erasures SET attempts = attempts + 1 WHERE id = ?", (erasure_id,)))

    async def finish(self, erasure_id: str, counts: dict[str, int]) -> None:
        """Mark it done, forget the user key, and truncate the WAL that still held it."""
        await self._call(lambda c: c.execute(
            "UPDATE erasures SET status = 'done', user_key = NULL, error = NULL, counts = ?, done_at = ? WHERE id = ?",
            (json.dumps(counts), time.time(), erasure_id)))
        await asyncio.to_thread(self._truncate)

    def _truncate(self) -> None:
        with self._lock:
            checkpoint(self._conn)

    async def fail(self, erasure_id: str, error: str) -> None:
        """Record why a run failed (it stays to be resumed; ``status`` says ``failed``)."""
        await self._call(lambda c: c.execute("UPDATE erasures SET status = 'failed', error = ? WHERE id = ?",
                                             (error[:500], erasure_id)))

    async def exported(self, tenant: str, user_hash: str, requester: str, counts: dict[str, int]) -> ErasureRow:
        """Log an export (done when logged: the stream was written)."""
        eid = "ex_" + uuid.uuid4().hex
        now = time.time()

        def fn(conn: sqlite3.Connection) -> ErasureRow:
            conn.execute("INSERT INTO erasures (id, kind, tenant, user_key, user_hash, requester, status, counts, "
                         "created_at, done_at) VALUES (?, 'export', ?, NULL, ?, ?, 'done', ?, ?, ?)",
                         (eid, tenant, user_hash, requester, json.dumps(counts), now, now))
            return _row(conn.execute("SELECT * FROM erasures WHERE id = ?", (eid,)).fetchone())

        return await self._call(fn)

    async def get(self, tenant: str, erasure_id: str) -> ErasureRow | None:
        """One row of ``tenant`` (another tenant's id reads as absent)."""
        r = await self._call(lambda c: c.execute("SELECT * FROM erasures WHERE tenant = ? AND id = ?",
                                                 (tenant, erasure_id)).fetchone())
        return None if r is None else _row(r)

    async def unfinished(self) -> list[tuple[ErasureRow, str | None]]:
        """Every erasure not done (all tenants) with its user key (None: the whole tenant), oldest first."""
        rows = await self._call(lambda c: c.execute(
            "SELECT * FROM erasures WHERE kind = 'erasure' AND status != 'done' ORDER BY created_at").fetchall())
        return [(_row(r), r["user_key"]) for r in rows]

    async def recent(self, tenant: str | None, limit: int = 50) -> list[ErasureRow]:
        """Newest rows of ``tenant`` (None: every tenant, for the operator), newest first."""
        where, args = ("", ()) if tenant is None else ("WHERE tenant = ?", (tenant,))
        rows = await self._call(lambda c: c.execute(
            f"SELECT * FROM erasures {where} ORDER BY created_at DESC LIMIT ?",
            (*args, max(1, min(limit, MAX_LIST)))).fetchall())
        return [_row(r) for r in rows]
