"""Embedded store of turn traces: one SQLite file (stdlib ``sqlite3``, WAL), tenant-keyed.

Keys: a trace is keyed by (tenant, id); every read names the tenant, so one tenant's traces are
invisible to another (an id only another tenant holds reads as one that does not exist).

Bounds: each write first deletes the tenant's traces older than ``retention_days`` and then all
but the newest ``max_per_tenant - 1`` of them, so a tenant holds at most ``max_per_tenant`` traces
(each already cut to the config's text and prompt sizes), and a trace lives at most
``retention_days`` (reads also hide expired ones that no write has pruned yet).

Async-safety as :class:`recallserve.serve.context.SessionStore`: each call runs in a worker thread on one
connection under a lock, one short transaction per call. In the cluster the ``state`` deployment
owns the file (``deployments/state.py``) and every ingress replica reaches it through a handle.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from recallserve.serve.erasure.sqlite import checkpoint, harden
from recallserve.serve.traces._models import TraceConfig, TraceNotFoundError, TraceSession, TraceSummary, TurnTrace

__all__ = ["TraceStore", "MAX_LIST"]

_T = TypeVar("_T")
#: Most rows one list call returns.
MAX_LIST = 500

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS turns (
        tenant TEXT NOT NULL, id TEXT NOT NULL, created_at REAL NOT NULL, session_id TEXT, user_id TEXT NOT NULL,
        summary TEXT NOT NULL, context TEXT NOT NULL, body TEXT NOT NULL, PRIMARY KEY (tenant, id))""",
    "CREATE INDEX IF NOT EXISTS turns_recent ON turns (tenant, created_at)",
    "CREATE INDEX IF NOT EXISTS turns_session ON turns (tenant, session_id, created_at)",
)


def summarise(trace: TurnTrace) -> TraceSummary:
    """The list line of ``trace``."""
    route = trace.route.get("route") if trace.route else None
    return TraceSummary(id=trace.id, created_at=trace.created_at, user=trace.user, session_id=trace.session_id,
                        path=trace.path, route=route, question=trace.question[:200],
                        finish_reason=trace.finish_reason, steps=len(trace.steps), tool_calls=len(trace.tool_calls),
                        total_ms=trace.timings_ms.get("total"))


class TraceStore:
    """Turn traces of every tenant in one SQLite file.

    Args:
        path: database file (parent folders are created); ``":memory:"`` for a throwaway store.
        config: retention days and the per-tenant cap.
    """

    def __init__(self, path: str | Path, config: TraceConfig | None = None) -> None:
        if str(path) != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.config = config or TraceConfig()
        self._conn = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None, timeout=30.0)
        self._conn.row_factory = sqlite3.Row
        self._lock = threading.Lock()
        with self._lock:
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=NORMAL")
            harden(self._conn)
            for stmt in _SCHEMA:
                self._conn.execute(stmt)

    def _locked(self, fn: Callable[[sqlite3.Connection], _T], write: bool) -> _T:
        with self._lock:
            if not write:
                return fn(self._conn)
            with self._conn:  # NOTE: sqlite3's context manager commits, or rolls back on an exception
                self._conn.execute("BEGIN IMMEDIATE")
                return fn(self._conn)

    async def _call(self, fn: Callable[[sqlite3.Connection], _T], write: bool = False) -> _T:
        return await asyncio.to_thread(self._locked, fn, write)

    def close(self) -> None:
        """Close the database (pending calls must have finished)."""
        with self._lock:
            self._conn.close()

    def _cutoff(self, now: float) -> float:
        return now - self.config.retention_days * 86400.0

    async def put(self, tenant: str, trace: TurnTrace) -> None:
        """Store ``trace`` for ``tenant`` (replacing one of the same id), pruning the tenant's old ones."""
        body = trace.model_dump_json()
        summary = summarise(trace).model_dump_json()
        # NOTE: the session list reads only this (mode, breakdown), never the whole body.
        context = json.dumps({k: trace.context.get(k) for k in ("mode", "breakdown")})
        keep = self.config.max_per_tenant - 1

        def fn(conn: sqlite3.Connection) -> None:
            conn.execute("DELETE FROM turns WHERE tenant = ? AND created_at < ?", (tenant, self._cutoff(time.time())))
            # NOTE: the newest `keep` stay (index range scan on turns_recent); then this one is added.
            conn.execute("DELETE FROM turns WHERE tenant = ? AND rowid NOT IN (SELECT rowid FROM turns WHERE "
                         "tenant = ? ORDER BY created_at DESC LIMIT ?)", (tenant, tenant, keep))
            conn.execute("INSERT OR REPLACE INTO turns (tenant, id, created_at, session_id, user_id, summary, context, "
                         "body) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                         (tenant, trace.id, trace.created_at, trace.session_id, trace.user, summary, context, body))

        await self._call(fn, write=True)

    async def recent(self, tenant: str, limit: int = 50, *, session_id: str | None = None,
                     before: float | None = None) -> list[TraceSummary]:
        """The tenant's newest traces (of one session when ``session_id``), newest first, created
        before ``before`` when given (the next page); at most ``min(limit, MAX_LIST)``."""
        where, args = ["tenant = ?", "created_at >= ?"], [tenant, self._cutoff(time.time())]
        if session_id is not None:
            where.append("session_id = ?")
            args.append(session_id)
        if before is not None:
            where.append("created_at < ?")
            args.append(before)
        sql = f"SELECT summary FROM turns WHERE {' AND '.join(where)} ORDER BY created_at DESC LIMIT ?"

        def fn(conn: sqlite3.Connection) -> list[TraceSummary]:
            rows = conn.execute(sql, (*args, max(1, min(limit, MAX_LIST)))).fetchall()
            return [TraceSummary.model_validate_json(r["summary"]) for r in rows]

        return await self._call(fn)

    async def get(self, tenant: str, trace_id: str) -> TurnTrace:
        """One trace of ``tenant``, or :class:`TraceNotFoundError`."""

        def fn(conn: sqlite3.Connection) -> TurnTrace:
            row = conn.execute("SELECT body FROM turns WHERE tenant = ? AND id = ? AND created_at >= ?",
                               (tenant, trace_id, self._cutoff(time.time()))).fetchone()
            if row is None:
                raise TraceNotFoundError(f"turn {trace_id!r} not found")
            return TurnTrace.model_validate_json(row["body"])

        return await self._call(fn)

    async def sessions(self, tenant: str, limit: int = 50) -> list[TraceSession]:
        """The tenant's sessions with a kept trace, most recently active first, each with its last
        turn's context mode and token breakdown."""

        def fn(conn: sqlite3.Connection) -> list[TraceSession]:
            rows = conn.execute(
                "SELECT t.session_id, t.user_id, t.id, t.created_at, t.context, g.n FROM turns t JOIN ("
                "SELECT session_id, MAX(created_at) AS last, COUNT(*) AS n FROM turns WHERE tenant = ? "
                "AND session_id IS NOT NULL AND created_at >= ? GROUP BY session_id) g "
                "ON t.session_id = g.session_id AND t.created_at = g.last WHERE t.tenant = ? "
                "ORDER BY t.created_at DESC LIMIT ?",
                (tenant, self._cutoff(time.time()), tenant, max(1, min(limit, MAX_LIST)))).fetchall()
            out = []
            for r in rows:
                context: dict[str, Any] = json.loads(r["context"])
                out.append(TraceSession(session_id=r["session_id"], user=r["user_id"], turns=r["n"],
                                        last_at=r["created_at"], last_turn_id=r["id"], mode=context.get("mode"),
                                        breakdown=context.get("breakdown") or {}))
            return out

        return await self._call(fn)

    async def erase_user(self, tenant: str, user: str | None) -> dict[str, int]:
        """Delete every trace of ``user`` (None: of the whole tenant), then truncate the SQLite WAL.

        A trace holds the turn's question, answer, recalled memories and rendered prompt: all of
        it goes with the row. Returns ``{"turns": rows deleted}``.
        """
        where, args = ("tenant = ?", (tenant,)) if user is None else ("tenant = ? AND user_id = ?", (tenant, user))
        n = await self._call(lambda c: c.execute(f"DELETE FROM turns WHERE {where}", args).rowcount, write=True)

        def truncate() -> None:
            with self._lock:
                checkpoint(self._conn)

        await asyncio.to_thread(truncate)
        return {"turns": n}

    async def expire_before(self, tenant: str, before: float) -> dict[str, int]:
        """Delete ``tenant``'s traces created before ``before`` (a retention limit); then truncate the WAL."""
        n = await self._call(lambda c: c.execute("DELETE FROM turns WHERE tenant = ? AND created_at < ?",
                                                 (tenant, before)).rowcount, write=True)

        def truncate() -> None:
            with self._lock:
                checkpoint(self._conn)

        await asyncio.to_thread(truncate)
        return {"turns": n}

    async def export_user(self, tenant: str, user: str | None) -> dict[str, Any]:
        """Every trace :meth:`erase_user` would delete (expired ones not yet pruned included), oldest first."""
        where, args = ("tenant = ?", (tenant,)) if user is None else ("tenant = ? AND user_id = ?", (tenant, user))

        def fn(conn: sqlite3.Connection) -> dict[str, Any]:
            rows = conn.execute(f"SELECT body FROM turns WHERE {where} ORDER BY created_at", args).fetchall()
            return {"turns": [json.loads(r["body"]) for r in rows]}

        return await self._call(fn)

    async def count(self, tenant: str) -> int:
        """Traces the tenant holds (expired ones not yet pruned included)."""
        return await self._call(lambda c: int(c.execute("SELECT COUNT(*) FROM turns WHERE tenant = ?",
                                                        (tenant,)).fetchone()[0]))
