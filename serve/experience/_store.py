"""Durable storage of experience records: embedded SQLite (one file per data dir) or PostgreSQL.

Records are stored as their JSON (pydantic ``model_dump_json``), embeddings as raw
little-endian float32 bytes: no pickle, readable by any SQL client, survives restarts.
The primary key is ``(tenant, id)``: one tenant can never read or overwrite another's record.
The SQL is written once for both backends (:mod:`recallserve.serve.statedb`).
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from recallserve.serve.experience._schema import ExperienceRecord, Tier
from recallserve.serve.statedb import Connection, Database, SqliteDatabase, statements

__all__ = ["StoredRow", "ExperienceStore"]

_T = TypeVar("_T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS experiences (
    tenant TEXT NOT NULL,
    id TEXT NOT NULL,
    tier TEXT NOT NULL CHECK (tier IN ('active', 'archival', 'review')),
    domain TEXT NOT NULL,
    topic TEXT NOT NULL,
    family TEXT NOT NULL,
    created_at REAL NOT NULL,
    last_used_at REAL NOT NULL,
    expires_at REAL,
    label TEXT,
    error_tags TEXT NOT NULL,
    use_count INTEGER NOT NULL DEFAULT 0,
    record TEXT NOT NULL,
    embedding BLOB NOT NULL,
    PRIMARY KEY (tenant, id)
);
CREATE INDEX IF NOT EXISTS experiences_scope ON experiences (tenant, tier, domain, family);
CREATE INDEX IF NOT EXISTS experiences_topic ON experiences (tenant, topic);
"""
#: PostgreSQL schema versions of the experience store, oldest first (append; never edit a shipped one).
PG_MIGRATIONS: tuple[str, ...] = (
    """
CREATE TABLE experiences (
    tenant TEXT NOT NULL, id TEXT NOT NULL,
    tier TEXT NOT NULL CHECK (tier IN ('active', 'archival', 'review')),
    domain TEXT NOT NULL, topic TEXT NOT NULL, family TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL, last_used_at DOUBLE PRECISION NOT NULL, expires_at DOUBLE PRECISION,
    label TEXT, error_tags TEXT NOT NULL, use_count BIGINT NOT NULL DEFAULT 0,
    record TEXT NOT NULL, embedding BYTEA NOT NULL,
    PRIMARY KEY (tenant, id)
);
CREATE INDEX experiences_scope ON experiences (tenant, tier, domain, family);
CREATE INDEX experiences_topic ON experiences (tenant, topic);
""",
)
_COLS = "tenant, id, tier, domain, topic, family, created_at, last_used_at, expires_at, label, use_count, record, embedding"


@dataclass
class StoredRow:
    """One stored record with its cache state."""

    tenant: str
    record: ExperienceRecord
    tier: Tier
    family: str
    last_used_at: float
    use_count: int
    embedding: np.ndarray

    @property
    def id(self) -> str:
        return self.record.metadata.id


_PUT_COLS = (*(c.strip() for c in _COLS.split(",")), "error_tags")
# NOTE: an upsert (not SQLite's INSERT OR REPLACE) so that one statement serves both backends.
_PUT = (f"INSERT INTO experiences ({', '.join(_PUT_COLS)}) VALUES ({','.join('?' * len(_PUT_COLS))}) "
        f"ON CONFLICT (tenant, id) DO UPDATE SET "
        + ", ".join(f"{c} = excluded.{c}" for c in _PUT_COLS if c not in ("tenant", "id")))


def _sqlite_schema(conn: Connection) -> None:
    for stmt in statements(_SCHEMA):
        conn.execute(stmt)


def _row(r: Sequence[Any]) -> StoredRow:
    tenant, _id, tier, _d, _t, family, _c, last_used, _e, _l, uses, rec, emb = r
    return StoredRow(
        tenant=tenant, record=ExperienceRecord.model_validate_json(rec), tier=tier, family=family,
        last_used_at=float(last_used), use_count=int(uses), embedding=np.frombuffer(bytes(emb), dtype="<f4").copy(),
    )


def _in_thread(fn: Callable[..., _T]) -> Callable[..., Coroutine[Any, Any, _T]]:
    """The method as a coroutine that runs it in a worker thread.

    NOTE: row decoding (pydantic JSON, numpy) and SQLite I/O stay off the event loop: in a cluster
    one ``state`` replica serves the calls of every ingress replica, so a long ``query`` on its loop
    would stall every chat turn's session calls behind it.
    """

    @functools.wraps(fn)
    async def run(self: Any, *args: Any, **kwargs: Any) -> _T:
        return await asyncio.to_thread(fn, self, *args, **kwargs)

    return run


class ExperienceStore:
    """Experience records of every tenant in one database; every public method is a coroutine.

    Args:
        data_dir: folder of ``experiences.sqlite3`` when ``db`` is None.
        db: an open database to use instead (a ``PostgresDatabase`` shared by the state stores);
            its owner closes it.
    """

    def __init__(self, data_dir: Path | str | None = None, *, db: Database | None = None) -> None:
        if db is None:
            if data_dir is None:
                raise ValueError("ExperienceStore: give data_dir or db")
            db = SqliteDatabase(Path(data_dir) / "experiences.sqlite3")
            self._owns_db = True
        else:
            self._owns_db = False
        self.db = db
        self.path = Path(db.path) if isinstance(db, SqliteDatabase) else None
        db.ensure_schema("experiences", _sqlite_schema, PG_MIGRATIONS)

    def close(self) -> None:
        """Close the database when this store opened it."""
        if self._owns_db:
            self.db.close()

    def _read(self, fn: Callable[[Connection], _T]) -> _T:
        return self.db.run(fn, write=False)

    def _write(self, fn: Callable[[Connection], _T]) -> _T:
        return self.db.run(fn, write=True)

    @_in_thread
    def put(self, tenant: str, record: ExperienceRecord, *, tier: Tier, family: str, embedding: np.ndarray,
            last_used_at: float, use_count: int = 0) -> None:
        """Insert or replace a record (same tenant and id overwrites)."""
        md = record.metadata
        emb = np.ascontiguousarray(embedding, dtype="<f4").tobytes()
        args = (tenant, md.id, tier, md.task_domain, md.topic, family, md.timestamp, last_used_at, md.expires_at,
                record.evaluation.human_label, use_count, record.model_dump_json(), emb,
                json.dumps(record.evaluation.error_tags))
        self._write(lambda c: c.execute(_PUT, args))

    @_in_thread
    def get(self, tenant: str, exp_id: str) -> StoredRow | None:
        """The record ``exp_id`` of ``tenant``, or None."""
        r = self._read(lambda c: c.execute(f"SELECT {_COLS} FROM experiences WHERE tenant = ? AND id = ?",
                                           (tenant, exp_id)).fetchone())
        return _row(r) if r else None

    @_in_thread
    def query(self, tenant: str, *, tiers: Sequence[Tier], domain: str | None = None, family: str | None = None,
              topic_prefix: str | None = None, now: float | None = None, limit: int | None = None,
              order: str = "last_used_at DESC") -> list[StoredRow]:
        """Rows of ``tenant`` in ``tiers``, optionally filtered; expired rows excluded when ``now`` is given."""
        sql = f"SELECT {_COLS} FROM experiences WHERE tenant = ? AND tier IN ({','.join('?' * len(tiers))})"
        args: list[object] = [tenant, *tiers]
        if domain is not None:
            sql += " AND domain = ?"
            args.append(domain)
        if family is not None:
            sql += " AND family = ?"
            args.append(family)
        if topic_prefix:
            sql += " AND (topic = ? OR topic LIKE ? ESCAPE '\\')"
            esc = topic_prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
            args += [topic_prefix, esc + "/%"]
        if now is not None:
            sql += " AND (expires_at IS NULL OR expires_at > ?)"
            args.append(now)
        if order not in ("last_used_at DESC", "created_at DESC", "created_at ASC"):
            raise ValueError(f"order {order!r} is not supported")
        sql += f" ORDER BY {order}, id"
        if limit is not None:
            sql += " LIMIT ?"
            args.append(int(limit))
        rows = self._read(lambda c: c.execute(sql, args).fetchall())
        return [_row(r) for r in rows]

    @_in_thread
    def active_domains(self, tenant: str) -> list[tuple[str, float]]:
        """``(domain, last use)`` of each task domain of ``tenant``'s active tier, most recently used first."""
        rows = self._read(lambda c: c.execute(
            "SELECT domain, MAX(last_used_at) AS used FROM experiences WHERE tenant = ? AND tier = 'active' "
            "GROUP BY domain ORDER BY used DESC, domain", (tenant,)).fetchall())
        return [(str(d), float(t)) for d, t in rows]

    @_in_thread
    def set_tier(self, tenant: str, ids: Iterable[str], tier: Tier) -> None:
        """Move records to ``tier``."""
        rows = [(tier, tenant, i) for i in ids]
        if rows:
            self._write(lambda c: c.executemany("UPDATE experiences SET tier = ? WHERE tenant = ? AND id = ?", rows))

    @_in_thread
    def touch(self, tenant: str, uses: Iterable[tuple[str, float, str]]) -> None:
        """Mark records used: ``(id, time, updated record JSON)`` each; of the record, only its
        ``evaluation.retrieval_score`` is written.

        NOTE: the search read the record before its touch: writing that whole copy back undid a
        label (or a re-create) stored in between, leaving a row filed active whose record had no
        label, note or reviewer. The score is set inside the record as it is now.
        """
        rows = [(t, json.loads(rec)["evaluation"].get("retrieval_score"), tenant, i) for i, t, rec in uses]
        sql = (f"UPDATE experiences SET last_used_at = ?, use_count = use_count + 1, "
               f"record = {self.db.dialect.set_retrieval_score} WHERE tenant = ? AND id = ?")
        if rows:
            self._write(lambda c: c.executemany(sql, rows))

    @_in_thread
    def archive_expired(self, now: float) -> int:
        """Move active records whose hard expiry has passed to archival (all tenants); returns how many.

        NOTE: 002 moves an expired record out of the active cache; it is not deleted (an
        acknowledged write stays readable by its id), and retrieval skips expired rows anyway.
        """
        return int(self._write(lambda c: c.execute(
            "UPDATE experiences SET tier = 'archival' WHERE tier = 'active' "
            "AND expires_at IS NOT NULL AND expires_at <= ?", (now,)).rowcount))

    def _owner_where(self, tenant: str, user: str | None) -> tuple[str, tuple[str, ...]]:
        # NOTE: the owner lives in the record's JSON (metadata.user); the tenant's index narrows first.
        if user is None:
            return "tenant = ?", (tenant,)
        return f"tenant = ? AND {self.db.dialect.record_user} = ?", (tenant, user)

    @_in_thread
    def erase_user(self, tenant: str, user: str | None) -> dict[str, object]:
        """Delete every record of ``user`` (None: of the whole tenant), then truncate the SQLite WAL.

        Returns:
            ``{"experiences": rows deleted, "ids": their ids}`` (the ids find their memory segments,
            source ids ``experience:<id>:<segment>``, written before a record carried its owner).
        """
        where, args = self._owner_where(tenant, user)
        def fn(c: Connection) -> tuple[list[str], int]:
            found = [r[0] for r in c.execute(f"SELECT id FROM experiences WHERE {where}", args)]
            return found, c.execute(f"DELETE FROM experiences WHERE {where}", args).rowcount

        ids, n = self._write(fn)
        self.db.release_erased(("experiences",))
        return {"experiences": n, "ids": ids}

    @_in_thread
    def export_user(self, tenant: str, user: str | None) -> dict[str, Any]:
        """Every record :meth:`erase_user` would delete, with its tier and use count, oldest first."""
        where, args = self._owner_where(tenant, user)
        rows = self._read(lambda c: c.execute(f"SELECT tier, use_count, record FROM experiences WHERE {where} "
                                              "ORDER BY created_at, id", args).fetchall())
        return {"experiences": [{"tier": t, "use_count": int(u), "record": json.loads(r)} for t, u, r in rows]}

    @_in_thread
    def tenants(self) -> list[str]:
        """Tenants with at least one record."""
        return self._read(lambda c: [r[0] for r in c.execute("SELECT DISTINCT tenant FROM experiences ORDER BY tenant")])

    @_in_thread
    def active_freshness(self, now: float, rate: float) -> float | None:
        """Mean ``1/(1 + rate x days since last use)`` over active records; None when there are none."""
        g = self.db.dialect.greatest
        r = self._read(lambda c: c.execute(
            f"SELECT AVG(1.0 / (1.0 + ? * {g}(0.0, (? - last_used_at) / 86400.0))) FROM experiences "
            "WHERE tier = 'active'", (rate, now)).fetchone())
        return None if r is None or r[0] is None else float(r[0])
