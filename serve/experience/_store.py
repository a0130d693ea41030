"""Durable storage of experience records in embedded SQLite (stdlib), one file per data dir.

Records are stored as their JSON (pydantic ``model_dump_json``), embeddings as raw
little-endian float32 bytes: no pickle, readable by any SQLite client, survives restarts.
The primary key is ``(tenant, id)``: one tenant can never read or overwrite another's record.
"""

from __future__ import annotations

import asyncio
import functools
import json
import sqlite3
import threading
from collections.abc import Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from recallserve.serve.experience._schema import ExperienceRecord, Tier

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


def _row(r: tuple) -> StoredRow:  # type: ignore[type-arg]
    tenant, _id, tier, _d, _t, family, _c, last_used, _e, _l, uses, rec, emb = r
    return StoredRow(
        tenant=tenant, record=ExperienceRecord.model_validate_json(rec), tier=tier, family=family,
        last_used_at=float(last_used), use_count=int(uses), embedding=np.frombuffer(emb, dtype="<f4").copy(),
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
    """Thread-safe SQLite table of experience records; every public method is a coroutine."""

    def __init__(self, data_dir: Path | str) -> None:
        self.path = Path(data_dir) / "experiences.sqlite3"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        # NOTE: check_same_thread=False because calls come from the event loop and from
        # worker threads; the lock serialises them (SQLite itself is not the bottleneck here).
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)

    def close(self) -> None:
        """Close the database."""
        with self._lock:
            self._db.close()

    @_in_thread
    def put(self, tenant: str, record: ExperienceRecord, *, tier: Tier, family: str, embedding: np.ndarray,
            last_used_at: float, use_count: int = 0) -> None:
        """Insert or replace a record (same tenant and id overwrites)."""
        md = record.metadata
        emb = np.ascontiguousarray(embedding, dtype="<f4").tobytes()
        with self._lock:
            self._db.execute(
                f"INSERT OR REPLACE INTO experiences ({_COLS}, error_tags) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (tenant, md.id, tier, md.task_domain, md.topic, family, md.timestamp, last_used_at, md.expires_at,
                 record.evaluation.human_label, use_count, record.model_dump_json(), emb,
                 json.dumps(record.evaluation.error_tags)),
            )

    @_in_thread
    def get(self, tenant: str, exp_id: str) -> StoredRow | None:
        """The record ``exp_id`` of ``tenant``, or None."""
        with self._lock:
            r = self._db.execute(f"SELECT {_COLS} FROM experiences WHERE tenant = ? AND id = ?",
                                 (tenant, exp_id)).fetchone()
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
        with self._lock:
            rows = self._db.execute(sql, args).fetchall()
        return [_row(r) for r in rows]

    @_in_thread
    def active_domains(self, tenant: str) -> list[tuple[str, float]]:
        """``(domain, last use)`` of each task domain of ``tenant``'s active tier, most recently used first."""
        with self._lock:
            rows = self._db.execute(
                "SELECT domain, MAX(last_used_at) AS used FROM experiences WHERE tenant = ? AND tier = 'active' "
                "GROUP BY domain ORDER BY used DESC, domain", (tenant,)).fetchall()
        return [(str(d), float(t)) for d, t in rows]

    @_in_thread
    def set_tier(self, tenant: str, ids: Iterable[str], tier: Tier) -> None:
        """Move records to ``tier``."""
        with self._lock:
            self._db.executemany("UPDATE experiences SET tier = ? WHERE tenant = ? AND id = ?",
                                 [(tier, tenant, i) for i in ids])

    @_in_thread
    def touch(self, tenant: str, uses: Iterable[tuple[str, float, str]]) -> None:
        """Mark records used: ``(id, time, updated record JSON)`` each; of the record, only its
        ``evaluation.retrieval_score`` is written.

        NOTE: the search read the record before its touch: writing that whole copy back undid a
        label (or a re-create) stored in between, leaving a row filed active whose record had no
        label, note or reviewer. The score is set inside the record as it is now.
        """
        rows = [(t, json.loads(rec)["evaluation"].get("retrieval_score"), tenant, i) for i, t, rec in uses]
        with self._lock:
            self._db.executemany(
                "UPDATE experiences SET last_used_at = ?, use_count = use_count + 1, "
                "record = json_set(record, '$.evaluation.retrieval_score', ?) WHERE tenant = ? AND id = ?",
                rows,
            )

    @_in_thread
    def archive_expired(self, now: float) -> int:
        """Move active records whose hard expiry has passed to archival (all tenants); returns how many.

        NOTE: 002 moves an expired record out of the active cache; it is not deleted (an
        acknowledged write stays readable by its id), and retrieval skips expired rows anyway.
        """
        with self._lock:
            cur = self._db.execute("UPDATE experiences SET tier = 'archival' WHERE tier = 'active' "
                                   "AND expires_at IS NOT NULL AND expires_at <= ?", (now,))
        return cur.rowcount

    @_in_thread
    def tenants(self) -> list[str]:
        """Tenants with at least one record."""
        with self._lock:
            return [r[0] for r in self._db.execute("SELECT DISTINCT tenant FROM experiences ORDER BY tenant")]

    @_in_thread
    def active_freshness(self, now: float, rate: float) -> float | None:
        """Mean ``1/(1 + rate x days since last use)`` over active records; None when there are none."""
        with self._lock:
            r = self._db.execute(
                "SELECT AVG(1.0 / (1.0 + ? * MAX(0.0, (? - last_used_at) / 86400.0))) FROM experiences "
                "WHERE tier = 'active'", (rate, now)).fetchone()
        return None if r is None or r[0] is None else float(r[0])
