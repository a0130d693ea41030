"""The database under the state stores (sessions, experiences, turn traces): embedded SQLite or PostgreSQL.

Every store (:class:`recallserve.serve.context.SessionStore`,
:class:`recallserve.serve.experience.ExperienceStore`, :class:`recallserve.serve.traces.TraceStore`)
keeps its business logic in plain functions of a connection, ``fn(conn) -> T``, each run as one
short transaction by a :class:`Database`. The two backends differ only here:

- :class:`SqliteDatabase`: one file, one connection under a lock, writers ``BEGIN IMMEDIATE``
  (today's embedded default of ``recallserve up``; one process owns the file).
- :class:`PostgresDatabase`: a ``psycopg_pool`` pool per process, so every ingress replica of a
  cluster talks to the database itself (no single replica on the path). Writers run
  ``SERIALIZABLE`` and are retried on a serialization failure (at most :data:`PG_TRIES` runs), so
  a read-modify-write such as "next seq = message_count" behaves as under SQLite's one writer
  (a unique violation is retried too: the collision of two such writers shows as one);
  readers run ``REPEATABLE READ READ ONLY`` so a multi-query read (``snapshot``) sees one state.

The stores write their SQL once, with ``?`` placeholders and the portable subset of both
dialects; :class:`PgConnection` turns ``?`` into psycopg's ``%s``, and :class:`Dialect` holds
the few fragments that differ (scalar ``MAX`` vs ``GREATEST``, ``json_set`` vs ``jsonb_set``).
Rows answer both ``row[0]`` and ``row["name"]`` on both backends (:class:`Row`).

Schema: SQLite files keep each store's own ``ensure`` function (``CREATE ... IF NOT EXISTS``,
``PRAGMA user_version``). PostgreSQL gets versioned migrations: each store hands an ordered
tuple of SQL scripts (version ``i`` = script ``i-1``), and :meth:`PostgresDatabase.ensure_schema`
applies the missing ones in one transaction holding ``pg_advisory_xact_lock(MIGRATION_LOCK)``,
recording the version in ``recallserve_schema``. Two replicas starting together therefore never
race: the second waits on the lock, then finds the version already there and applies nothing.

A database that cannot be reached (connection refused, pool exhausted past its timeout, retries
used up) raises :class:`StateUnavailableError`, which the API answers as 503 with ``Retry-After``;
nothing was half-done (each call is one transaction).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar


__all__ = ["checkpoint", "connect", "harden", "Connection", "Database", "Dialect", "MIGRATION_LOCK", "PG_TRIES", "PgConnection", "VACUUM_LOCK_TIMEOUT", "PostgresDatabase",
           "Row", "SqliteDatabase", "StateUnavailableError", "statements"]

log = logging.getLogger(__name__)

_T = TypeVar("_T")

#: Key of the advisory lock that serialises schema migrations across processes (any fixed 64-bit int).
MIGRATION_LOCK = 0x7265_6361_6C6C_5F31  # b"recall_1"
#: Most runs of one write transaction under serialization failures (then 503).
PG_TRIES = 10
#: Longest wait of an erasure's VACUUM FULL for its table lock (then the erasure is retried).
VACUUM_LOCK_TIMEOUT = "10s"


class StateUnavailableError(Exception):
    """The state database cannot serve the call now (unreachable, pool exhausted, contention); retry."""


class Connection(Protocol):
    """What a store's transaction function may call: sqlite3's connection API, ``?`` placeholders."""

    def execute(self, sql: str, params: Sequence[Any] = ...) -> Any: ...

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> Any: ...


@dataclass(frozen=True)
class Dialect:
    """The SQL fragments that differ between the backends.

    Attributes:
        name: ``sqlite`` or ``postgres``.
        greatest: the two-argument scalar maximum function (``MAX`` in SQLite, ``GREATEST`` in PostgreSQL).
        set_retrieval_score: an expression of the ``record`` column (JSON text) with
            ``evaluation.retrieval_score`` set to the one ``?`` parameter (a number or NULL).
        record_user: an expression of the ``record`` column (JSON text): its ``metadata.user`` as
            text (NULL when absent), the owner an erasure or export selects by.
    """

    name: str
    greatest: str
    set_retrieval_score: str
    record_user: str


SQLITE = Dialect("sqlite", "MAX", "json_set(record, '$.evaluation.retrieval_score', ?)",
                  "json_extract(record, '$.metadata.user')")
POSTGRES = Dialect(
    "postgres", "GREATEST",
    # NOTE: to_jsonb(NULL) is NULL and jsonb_set(..., NULL) would null the whole record: COALESCE to JSON null.
    "jsonb_set(record::jsonb, '{evaluation,retrieval_score}', COALESCE(to_jsonb(?::double precision), "
    "'null'::jsonb))::text",
    "(record::jsonb #>> '{metadata,user}')",
)


class Database(Protocol):
    """One backend of the state stores: runs a store's transaction functions."""

    dialect: Dialect

    def run(self, fn: Callable[[Connection], _T], write: bool) -> _T:
        """``fn(conn)`` as one transaction (blocking; call it from a worker thread)."""
        ...

    async def call(self, fn: Callable[[Connection], _T], write: bool = False) -> _T:
        """:meth:`run` in a worker thread, so the event loop never waits on the database."""
        ...

    def ensure_schema(self, component: str, sqlite: Callable[[Connection], None], postgres: Sequence[str]) -> None:
        """Bring ``component``'s tables up to date: ``sqlite(conn)`` in a write transaction on SQLite,
        the missing scripts of ``postgres`` (versioned, under the migration lock) on PostgreSQL."""
        ...

    def release_erased(self, tables: Sequence[str]) -> None:
        """After an erasure: drop the copies of deleted rows the backend still keeps on disk in
        ``tables`` (SQLite: its ``-wal`` file; PostgreSQL: the dead row versions in the heap, TOAST and
        index files, by ``VACUUM FULL``); blocking."""
        ...

    def close(self) -> None:
        """Release the file or the pool (pending calls must have finished)."""
        ...


def statements(script: str) -> list[str]:
    """The ``;``-separated statements of ``script`` (none of this project's DDL has a ``;`` inside one)."""
    return [s.strip() for s in script.split(";") if s.strip()]



# ---- erasure on disk (issue 41): secure_delete and a truncating checkpoint, one place -------------
#: Tries of a checkpoint that found the WAL busy, 50 ms apart (a 1 s bound).
_TRIES = 20


def connect(path: str | Path, synchronous: str = "NORMAL") -> sqlite3.Connection:
    """An autocommit connection in WAL mode with rows by name and :func:`harden` applied (its
    parent folder created), for one store's single connection under that store's lock."""
    if str(path) != ":memory:":
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None, timeout=30.0)
    conn.row_factory = sqlite3.Row
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={synchronous}")
    harden(conn)
    return conn


def harden(conn: sqlite3.Connection) -> None:
    """Zero deleted content in place on this connection (``PRAGMA secure_delete = ON``)."""
    conn.execute("PRAGMA secure_delete = ON")


def checkpoint(conn: sqlite3.Connection) -> None:
    """Copy the WAL into the database and truncate it to zero bytes.

    Raises:
        RuntimeError: still busy after the bounded tries (the erasure is retried, never reported done).
    """
    for _ in range(_TRIES):
        busy, _log, _done = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        if busy == 0:
            return
        time.sleep(0.05)
    raise RuntimeError("sqlite: wal_checkpoint(TRUNCATE) stayed busy; the erasure will be retried")


class SqliteDatabase:
    """One SQLite file in WAL mode: one connection, one lock, one short transaction per call.

    Args:
        path: database file (parent folders are created); ``":memory:"`` for a throwaway one.
        synchronous: ``PRAGMA synchronous`` (``NORMAL``; ``FULL`` where a commit must survive a power loss).
    """

    dialect = SQLITE

    def __init__(self, path: str | Path, synchronous: str = "NORMAL") -> None:
        if synchronous not in ("NORMAL", "FULL"):
            raise ValueError(f"synchronous: NORMAL or FULL, got {synchronous!r}")
        if str(path) != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.path = str(path)
        # NOTE: isolation_level=None = autocommit; transactions are explicit BEGIN IMMEDIATE so a
        # writer takes the lock up front instead of failing half-way on upgrade.
        self._conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=30.0)
        self._conn.row_factory = sqlite3.Row
        self._lock = threading.Lock()
        with self._lock:
            self._conn.execute("PRAGMA journal_mode=WAL")
            # NOTE: NORMAL is durable across application crashes in WAL mode (not power loss of
            # the last commit), the usual trade for a chat store.
            self._conn.execute(f"PRAGMA synchronous={synchronous}")
            # NOTE: deleted rows are zeroed in place (issue 41: erased text leaves the file).
            self._conn.execute("PRAGMA secure_delete = ON")

    def release_erased(self, tables: Sequence[str] = ()) -> None:
        """Copy the WAL into the file and cut it to zero bytes (after an erasure; bounded tries);
        ``secure_delete`` has already zeroed the deleted rows in the file itself (so ``tables`` is
        not needed: the whole WAL goes)."""
        if self.path == ":memory:":
            return
        with self._lock:
            checkpoint(self._conn)

    def run(self, fn: Callable[[Connection], _T], write: bool) -> _T:
        with self._lock:
            if not write:
                return fn(self._conn)
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                out = fn(self._conn)
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")
            return out

    async def call(self, fn: Callable[[Connection], _T], write: bool = False) -> _T:
        return await asyncio.to_thread(self.run, fn, write)

    def ensure_schema(self, component: str, sqlite: Callable[[Connection], None], postgres: Sequence[str]) -> None:
        self.run(sqlite, write=True)

    def close(self) -> None:
        with self._lock:
            self._conn.close()


class Row(tuple):  # type: ignore[type-arg]
    """A result row of the PostgreSQL backend, read as sqlite3.Row is: by position, by column name,
    unpacked as a tuple, and ``dict(row)``."""

    _index: dict[str, int]

    def __new__(cls, values: Sequence[Any], index: dict[str, int]) -> Row:
        row = super().__new__(cls, values)
        row._index = index
        return row

    def __getitem__(self, key: Any) -> Any:  # type: ignore[override]
        return super().__getitem__(self._index[key] if isinstance(key, str) else key)

    def keys(self) -> list[str]:
        return list(self._index)


def _row_factory(cursor: Any) -> Callable[[Sequence[Any]], Row]:
    index = {col.name: i for i, col in enumerate(cursor.description or ())}
    return lambda values: Row(values, index)


@functools.lru_cache(maxsize=1024)
def _pg_sql(sql: str) -> str:
    """``?`` placeholders as psycopg's ``%s`` (a literal ``%`` doubled). NOTE: the stores' SQL has no
    ``?`` inside a string literal; values such as LIKE patterns always travel as parameters."""
    return sql.replace("%", "%%").replace("?", "%s")


def _pg_params(params: Iterable[Any]) -> tuple[Any, ...]:
    """``params`` with NUL in text replaced by U+FFFD.

    NOTE: PostgreSQL's text cannot hold NUL (psycopg refuses the value: a 500), while SQLite stores
    it. The API refuses control characters in every key (tenant, user, session and record ids), so
    only free text (a message's content) can carry one, and it is stored with U+FFFD instead of a
    refused write on one backend only.
    """
    return tuple(p.replace("\x00", "\ufffd") if isinstance(p, str) and "\x00" in p else p for p in params)


class PgConnection:
    """A psycopg connection seen through :class:`Connection` (``?`` placeholders)."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        # NOTE: params is never None: psycopg then parses the placeholders and undoubles "%%".
        return self._conn.execute(_pg_sql(sql), _pg_params(params))

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> Any:
        cur = self._conn.cursor()
        cur.executemany(_pg_sql(sql), [_pg_params(r) for r in rows])
        return cur


class PostgresDatabase:
    """A PostgreSQL database reached through a ``psycopg_pool.ConnectionPool`` of this process.

    Args:
        dsn: libpq connection string or URI (``postgresql://user:pass@host:5432/db``). Never logged.
        pool_size: most connections this process holds (each ingress replica has its own pool).
        acquire_timeout_s: longest wait for a free connection (or a first connect) before
            :class:`StateUnavailableError`.
        connect: open the pool now and wait until it holds a connection (a wrong DSN fails at start).
    """

    dialect = POSTGRES

    def __init__(self, dsn: str, *, pool_size: int = 8, acquire_timeout_s: float = 10.0, connect: bool = True) -> None:
        import psycopg_pool  # NOTE: a dependency of the Postgres backend only; SQLite users never load it

        self._pool = psycopg_pool.ConnectionPool(
            dsn, min_size=1, max_size=max(1, pool_size), timeout=acquire_timeout_s, open=True, name="recallserve-state",
            kwargs={"autocommit": True, "row_factory": _row_factory},
        )
        if connect:
            try:
                self._pool.wait(timeout=acquire_timeout_s)
            except psycopg_pool.PoolTimeout as exc:
                self._pool.close()
                raise StateUnavailableError(f"state database: no connection within {acquire_timeout_s:.0f} s "
                                            "(check state_db.dsn)") from exc

    def run(self, fn: Callable[[Connection], _T], write: bool) -> _T:
        import psycopg
        import psycopg_pool

        # NOTE: psycopg's SerializationFailure and DeadlockDetected are OperationalErrors (not
        # TransactionRollback's subclasses): named here, before the "unavailable" branch below.
        errors = psycopg.errors
        retried = (errors.SerializationFailure, errors.DeadlockDetected, errors.TransactionRollback,
                    errors.UniqueViolation)
        begin = "BEGIN ISOLATION LEVEL SERIALIZABLE" if write else "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"
        for attempt in range(PG_TRIES):
            try:
                with self._pool.connection() as conn:
                    conn.execute(begin)
                    try:
                        out = fn(PgConnection(conn))
                        conn.execute("COMMIT")
                    except BaseException:
                        if not conn.closed:
                            conn.execute("ROLLBACK")
                        raise
                    return out
            except retried as exc:
                # NOTE: a serialization failure or deadlock: run it again. A unique violation too,
                # as PostgreSQL's manual advises under SERIALIZABLE: two appends that both read
                # message_count = n collide on the key (n, ...) before the serialization check can
                # report it. A real duplicate is raised as itself after the last try.
                if attempt == PG_TRIES - 1:
                    if isinstance(exc, psycopg.errors.UniqueViolation):
                        raise
                    raise StateUnavailableError("state database: too much contention on this record; retry") from None
                # NOTE: jittered backoff, 2^attempt ms up to ~0.5 s, so the colliding writers part.
                time.sleep(random.uniform(0.5, 1.0) * 0.001 * 2 ** attempt)
            except (psycopg.OperationalError, psycopg_pool.PoolTimeout) as exc:
                raise StateUnavailableError(f"state database unavailable ({type(exc).__name__}); retry") from None
        raise AssertionError("unreachable")  # pragma: no cover

    async def call(self, fn: Callable[[Connection], _T], write: bool = False) -> _T:
        return await asyncio.to_thread(self.run, fn, write)

    def ensure_schema(self, component: str, sqlite: Callable[[Connection], None], postgres: Sequence[str]) -> None:
        """Apply ``postgres[have:]`` where ``have`` is the version recorded for ``component``, all in
        one transaction under the migration lock; a database newer than this code is refused."""
        with self._pool.connection() as conn, conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
            conn.execute("CREATE TABLE IF NOT EXISTS recallserve_schema (component TEXT PRIMARY KEY, "
                         "version INTEGER NOT NULL, applied_at DOUBLE PRECISION NOT NULL)")
            row = conn.execute("SELECT version FROM recallserve_schema WHERE component = %s", (component,)).fetchone()
            have = 0 if row is None else int(row[0])
            if have > len(postgres):
                raise RuntimeError(f"state database: {component} schema is version {have}, newer than this "
                                   f"code's {len(postgres)}; upgrade recallserve")
            for version in range(have + 1, len(postgres) + 1):
                for stmt in statements(postgres[version - 1]):
                    conn.execute(stmt)
                log.info("state database: %s schema migrated to version %d", component, version)
            if have < len(postgres):
                conn.execute("INSERT INTO recallserve_schema (component, version, applied_at) VALUES (%s, %s, %s) "
                             "ON CONFLICT (component) DO UPDATE SET version = excluded.version, "
                             "applied_at = excluded.applied_at", (component, len(postgres), time.time()))

    def release_erased(self, tables: Sequence[str] = ()) -> None:
        """``VACUUM (FULL) table`` for each of ``tables``: the dead row versions an erasure left.

        Why FULL: a DELETE only marks a row version dead; plain VACUUM makes its space reusable but
        leaves its bytes in the heap page (and its TOAST chunks and index entries) until a later
        write happens to overwrite them. VACUUM FULL copies the live rows into new files (heap,
        TOAST, every index rebuilt) and the old ones are truncated to zero at commit (unlinked at
        the next checkpoint), so no heap or index file under ``base/`` keeps the erased bytes.
        Cost: the table is rewritten whole (time and extra disk ~ its live size) under an ACCESS
        EXCLUSIVE lock that queues every read and write of it (``loadtests/results/erasure-pg-vacuum.json``).
        The lock wait is bounded by :data:`VACUUM_LOCK_TIMEOUT` (a long transaction on the table
        makes it fail; the erasure is then retried, never reported done).

        Not covered (docs/erasure.md): WAL segments under ``pg_wal`` keep the inserted text until
        checkpoints retire them, and archives, replicas and backups keep their own copies.
        Table names come from the stores' code, never from a request.
        """
        import psycopg

        try:
            with self._pool.connection() as conn:
                conn.execute(f"SET lock_timeout = '{VACUUM_LOCK_TIMEOUT}'")
                try:
                    for table in tables:
                        conn.execute(f"VACUUM (FULL) {table}")
                finally:
                    conn.execute("RESET lock_timeout")
        except psycopg.errors.LockNotAvailable:
            raise StateUnavailableError(f"state database: VACUUM FULL waited over {VACUUM_LOCK_TIMEOUT} for its "
                                        "lock; the erasure will be retried") from None

    def close(self) -> None:
        self._pool.close()
