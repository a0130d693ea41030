"""The session store: SQLite (embedded default, WAL mode) or PostgreSQL (clusters), surviving restarts.

Four tables: ``sessions`` (owner, mode, rolling summary), ``messages``, ``entities`` (the
verbatim entity table of each session) and ``user_memory`` (the user's constraints and facts,
retention 1 or more, carried into that user's next session).

Backends: the logic below is written once, as functions of a connection each run as one short
transaction by a :class:`recallserve.serve.statedb.Database` (``SqliteDatabase`` for a file,
``PostgresDatabase`` for a cluster's database; see that module for isolation and retries). Every
call runs in a worker thread, so the event loop never blocks on the database and concurrent
requests never interleave inside a transaction.

Keys: a session is keyed by (tenant, id); each tenant has its own namespace of session ids, so
the same id in two tenants is two independent sessions and one tenant can neither squat on
another's id nor learn whether it is in use (there is nothing shared to observe). Inside a
tenant the session belongs to the user that opened it: asking for it as another user of that
tenant gives :class:`SessionNotFoundError`, exactly as for an id that does not exist (the
tenant is the authenticated boundary; the user is the chat request's ``user`` field).

Files written before the tenant key (schema version 0: ``sessions.id`` the primary key) are
migrated in place on open, in one transaction (:mod:`recallserve.serve.context._store_schema`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from recallserve.serve.context._entities import Entity
from recallserve.serve.context._store_schema import MSG_COLS as _MSG_COLS
from recallserve.serve.context._store_schema import PG_MIGRATIONS, ensure_schema
from recallserve.serve.context._types import (
    Message,
    ModeName,
    Session,
    SessionNotFoundError,
    SummaryState,
)
from recallserve.serve.envs import recallserve_home
from recallserve.serve.statedb import Connection, Database, SqliteDatabase

__all__ = ["SessionStore", "default_store_path"]

_T = TypeVar("_T")

_WS = re.compile(r"\s+")


def default_store_path() -> Path:
    """``$RECALLSERVE_HOME/context.sqlite3`` (see :func:`recallserve.serve.envs.recallserve_home`)."""
    return recallserve_home() / "context.sqlite3"


def _row_to_message(row: Any) -> Message:
    return Message(
        seq=row["seq"], id=row["id"], role=row["role"], content=row["content"], timestamp=row["timestamp"],
        category=row["category"], retention=row["retention"], tokens=row["tokens"],
        tool_name=row["tool_name"], source_session=row["source_session"],
    )


def _memory_key(content: str) -> str:
    return hashlib.sha1(_WS.sub(" ", content.strip().lower()).encode()).hexdigest()


class SessionStore:
    """Sessions, messages, entity tables and user memory in one database.

    Args:
        path: SQLite file (parent folders are created; ``":memory:"`` for a throwaway store) when
            ``db`` is None; default ``$RECALLSERVE_HOME/context.sqlite3``.
        db: an open database to use instead (a ``PostgresDatabase`` shared by the state stores);
            its owner closes it.

    Example:
        >>> store = SessionStore(":memory:")
        >>> s = asyncio.run(store.open("acme", "u1", "s1"))
        >>> s.tenant
        'acme'
    """

    def __init__(self, path: str | Path | None = None, *, db: Database | None = None) -> None:
        if db is None:
            db = SqliteDatabase(default_store_path() if path is None else path)
            self._owns_db = True
        else:
            self._owns_db = False
        self.db = db
        self.path = getattr(db, "path", None)
        db.ensure_schema("sessions", ensure_schema, PG_MIGRATIONS)

    # -- plumbing -------------------------------------------------------------------------
    async def _call(self, fn: Callable[[Connection], _T], write: bool = False) -> _T:
        return await self.db.call(fn, write)

    def close(self) -> None:
        """Close the database when this store opened it (pending calls must have finished)."""
        if self._owns_db:
            self.db.close()

    # -- sessions -------------------------------------------------------------------------
    @staticmethod
    def _load(conn: Connection, tenant: str, user: str, session_id: str) -> Session:
        row = conn.execute("SELECT * FROM sessions WHERE tenant = ? AND id = ?", (tenant, session_id)).fetchone()
        if row is None or row["user_id"] != user:
            raise SessionNotFoundError(f"session {session_id!r} not found")
        return Session(
            id=row["id"], tenant=row["tenant"], user=row["user_id"], created_at=row["created_at"],
            mode=row["mode"], message_count=row["message_count"],
            summary=SummaryState(
                text=row["summary"], until_seq=row["summary_until"], updated_at=row["summary_at"],
                tokens=row["summary_tokens"], summariser=row["summariser"],
            ),
        )

    async def get(self, tenant: str, user: str, session_id: str) -> Session:
        """The session, or :class:`SessionNotFoundError` (also when owned by someone else)."""
        return await self._call(lambda c: self._load(c, tenant, user, session_id))

    async def open(
        self, tenant: str, user: str, session_id: str, *, mode: ModeName | None = None,
        carry_over: int = 50, now: float | None = None,
    ) -> Session:
        """Get the session, creating it when absent.

        A new session starts with the user's carried-over constraints and facts (at most
        ``carry_over`` of them, retention 3 first, newest first), stored as its first messages
        with ``source_session`` set. The id is looked up in ``tenant``'s namespace only, so another
        tenant's session of the same id is neither seen nor touched; an id of this tenant owned by
        another user raises :class:`SessionNotFoundError` (it can be neither read nor taken over).
        """
        ts = time.time() if now is None else now
        probe = Session(id=session_id, tenant=tenant, user=user, created_at=ts, mode=mode)  # validates fields

        def fn(conn: Connection) -> Session:
            row = conn.execute("SELECT 1 FROM sessions WHERE tenant = ? AND id = ?", (tenant, session_id)).fetchone()
            if row is not None:
                return self._load(conn, tenant, user, session_id)
            conn.execute(
                "INSERT INTO sessions (tenant, id, user_id, created_at, mode) VALUES (?, ?, ?, ?, ?)",
                (tenant, probe.id, user, ts, mode),
            )
            items = conn.execute(
                "SELECT * FROM user_memory WHERE tenant = ? AND user_id = ? "
                "ORDER BY retention DESC, created_at DESC LIMIT ?",
                (tenant, user, carry_over),
            ).fetchall()
            # NOTE: carried items keep their original chronological order inside the session.
            items = sorted(items, key=lambda r: r["created_at"])
            for seq, item in enumerate(items):
                conn.execute(
                    f"INSERT INTO messages ({_MSG_COLS}, tenant, session_id) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                    (seq, hashlib.sha1(f"{session_id}:{item['key']}".encode()).hexdigest(), item["role"],
                     item["content"], item["created_at"], item["category"], item["retention"], item["tokens"],
                     None, item["source_session"], tenant, session_id),
                )
            conn.execute("UPDATE sessions SET message_count = ? WHERE tenant = ? AND id = ?",
                         (len(items), tenant, session_id))
            return self._load(conn, tenant, user, session_id)

        return await self._call(fn, write=True)

    async def set_mode(self, tenant: str, user: str, session_id: str, mode: ModeName | None) -> None:
        """Set (or clear with None) the session's default mode."""

        def fn(conn: Connection) -> None:
            self._load(conn, tenant, user, session_id)
            conn.execute("UPDATE sessions SET mode = ? WHERE tenant = ? AND id = ?", (mode, tenant, session_id))

        await self._call(fn, write=True)

    async def delete(self, tenant: str, user: str, session_id: str) -> None:
        """Delete a session with its messages and entities (user memory stays)."""

        def fn(conn: Connection) -> None:
            self._load(conn, tenant, user, session_id)
            for table in ("messages", "entities"):
                conn.execute(f"DELETE FROM {table} WHERE tenant = ? AND session_id = ?", (tenant, session_id))
            conn.execute("DELETE FROM sessions WHERE tenant = ? AND id = ?", (tenant, session_id))

        await self._call(fn, write=True)

    # -- erasure and export (serve.erasure) ------------------------------------------------
    @staticmethod
    def _owned_sessions(conn: Connection, tenant: str, user: str | None) -> list[str]:
        if user is None:
            return [r["id"] for r in conn.execute("SELECT id FROM sessions WHERE tenant = ?", (tenant,))]
        return [r["id"] for r in conn.execute("SELECT id FROM sessions WHERE tenant = ? AND user_id = ?", (tenant, user))]

    async def erase_user(self, tenant: str, user: str | None) -> dict[str, int]:
        """Delete every session of ``user`` (None: of the whole tenant) with its messages, rolling
        summary and entity table, and the user's carried memory; then truncate the SQLite WAL.

        Returns:
            Rows deleted per table (``sessions``, ``messages``, ``entities``, ``user_memory``).
        """

        def fn(conn: Connection) -> dict[str, int]:
            counts = {"sessions": 0, "messages": 0, "entities": 0, "user_memory": 0}
            for sid in self._owned_sessions(conn, tenant, user):
                for table in ("messages", "entities"):
                    counts[table] += conn.execute(f"DELETE FROM {table} WHERE tenant = ? AND session_id = ?",
                                                  (tenant, sid)).rowcount
                counts["sessions"] += conn.execute("DELETE FROM sessions WHERE tenant = ? AND id = ?",
                                                   (tenant, sid)).rowcount
            if user is None:
                counts["user_memory"] = conn.execute("DELETE FROM user_memory WHERE tenant = ?", (tenant,)).rowcount
            else:
                counts["user_memory"] = conn.execute("DELETE FROM user_memory WHERE tenant = ? AND user_id = ?",
                                                     (tenant, user)).rowcount
            return counts

        counts = await self._call(fn, write=True)
        await asyncio.to_thread(self._checkpoint)
        return counts

    def _checkpoint(self) -> None:
        if self.path != ":memory:":
            # NOTE: every table that holds a session's text (the rolling summary is a column of sessions).
            self.db.release_erased(("sessions", "messages", "entities", "user_memory"))

    async def expire_before(self, tenant: str, before: float) -> dict[str, int]:
        """Delete ``tenant``'s sessions whose last message (or creation) is before ``before``
        (a retention limit), with their messages, summaries and entities; then truncate the WAL."""

        def fn(conn: Connection) -> dict[str, int]:
            old = [r["id"] for r in conn.execute(
                "SELECT s.id FROM sessions s WHERE s.tenant = ? AND COALESCE((SELECT MAX(m.timestamp) FROM messages m "
                "WHERE m.tenant = s.tenant AND m.session_id = s.id), s.created_at) < ?", (tenant, before))]
            counts = {"sessions": 0, "messages": 0, "entities": 0}
            for sid in old:
                for table in ("messages", "entities"):
                    counts[table] += conn.execute(f"DELETE FROM {table} WHERE tenant = ? AND session_id = ?",
                                                  (tenant, sid)).rowcount
                counts["sessions"] += conn.execute("DELETE FROM sessions WHERE tenant = ? AND id = ?",
                                                   (tenant, sid)).rowcount
            return counts

        counts = await self._call(fn, write=True)
        await asyncio.to_thread(self._checkpoint)
        return counts

    async def export_user(self, tenant: str, user: str | None) -> dict[str, Any]:
        """Everything :meth:`erase_user` would delete, as JSON-ready dicts (``sessions`` with their
        messages, summary and entities; ``user_memory``)."""

        def fn(conn: Connection) -> dict[str, Any]:
            sessions = []
            for sid in self._owned_sessions(conn, tenant, user):
                row = conn.execute("SELECT * FROM sessions WHERE tenant = ? AND id = ?", (tenant, sid)).fetchone()
                sessions.append({
                    "id": sid, "user": row["user_id"], "created_at": row["created_at"], "summary": row["summary"],
                    "messages": [m.model_dump(mode="json") for m in self._messages(conn, tenant, sid, -1)],
                    "entities": [dataclasses.asdict(e) for e in self._entities(conn, tenant, sid)],
                })
            where, args = ("tenant = ?", (tenant,)) if user is None else ("tenant = ? AND user_id = ?", (tenant, user))
            carried = [dict(r) for r in conn.execute(
                f"SELECT user_id, content, category, retention, created_at, source_session FROM user_memory "
                f"WHERE {where} ORDER BY created_at", args)]
            return {"sessions": sessions, "user_memory": carried}

        return await self._call(fn)

    # -- messages -------------------------------------------------------------------------
    async def append(
        self, session: Session, messages: Sequence[Message], entities: Sequence[Sequence[Entity]], *,
        max_entities: int | None = None,
    ) -> list[Message]:
        """Store messages (seq assigned here, atomically), their entities and user memory.

        Args:
            session: the owning session (ownership is re-checked inside the transaction).
            messages: messages to add, in order; their ``seq`` is ignored and reassigned.
            entities: per message, the entities extracted from it.
            max_entities: most rows the session's entity table keeps (``ContextConfig.
                max_entities_per_session``; None = no bound). Past it the least recently seen
                (lowest ``last_seq``, then the earliest stored) are evicted in the same
                transaction, so the table a turn reads is bounded and holds what the conversation
                is about now. NOTE: a parameter, not store state: behind the state deployment the
                store is built without the context config, and the manager passes it on each call.

        Returns:
            The stored messages with their seq.
        """
        if len(entities) != len(messages):
            raise ValueError(f"entities: need one list per message ({len(messages)}), got {len(entities)}")

        def fn(conn: Connection) -> list[Message]:
            current = self._load(conn, session.tenant, session.user, session.id)
            out = []
            for i, (msg, ents) in enumerate(zip(messages, entities)):
                stored = msg.model_copy(update={"seq": current.message_count + i})
                conn.execute(
                    f"INSERT INTO messages ({_MSG_COLS}, tenant, session_id) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                    (stored.seq, stored.id, stored.role, stored.content, stored.timestamp, stored.category,
                     stored.retention, stored.tokens, stored.tool_name, stored.source_session, session.tenant,
                     session.id),
                )
                # NOTE: of one message's entities only the last ``max_entities`` can stay (they
                # share its seq): the rest are not written only to be evicted below.
                for ent in ents if max_entities is None else ents[-max_entities:]:
                    conn.execute(
                        "INSERT INTO entities (tenant, session_id, kind, value, snippet, first_seq, last_seq) "
                        "VALUES (?,?,?,?,?,?,?) ON CONFLICT (tenant, session_id, kind, value) "
                        "DO UPDATE SET last_seq = excluded.last_seq",
                        (session.tenant, session.id, ent.kind, ent.value, ent.snippet, stored.seq, stored.seq),
                    )
                if stored.retention >= 1 and stored.category in ("constraint", "fact") and stored.role == "user":
                    conn.execute(
                        "INSERT INTO user_memory (tenant, user_id, key, role, content, category, retention, "
                        "tokens, created_at, source_session) VALUES (?,?,?,?,?,?,?,?,?,?) "
                        "ON CONFLICT (tenant, user_id, key) DO UPDATE SET created_at = excluded.created_at, "
                        f"retention = {self.db.dialect.greatest}(user_memory.retention, excluded.retention)",
                        (session.tenant, session.user, _memory_key(stored.content), stored.role, stored.content,
                         stored.category, stored.retention, stored.tokens, stored.timestamp,
                         stored.source_session or session.id),
                    )
                out.append(stored)
            if max_entities is not None:
                self._evict_entities(conn, session.tenant, session.id, max_entities)
            conn.execute(
                "UPDATE sessions SET message_count = ? WHERE tenant = ? AND id = ?",
                (current.message_count + len(messages), session.tenant, session.id),
            )
            return out

        return await self._call(fn, write=True)

    @staticmethod
    def _evict_entities(conn: Connection, tenant: str, session_id: str, keep: int) -> None:
        """Delete all but the ``keep`` most recently seen entities of the session (ties: the later stored stays)."""
        (count,) = conn.execute("SELECT COUNT(*) FROM entities WHERE tenant = ? AND session_id = ?",
                                (tenant, session_id)).fetchone()
        if count > keep:
            conn.execute(
                "DELETE FROM entities WHERE tenant = ? AND session_id = ? AND rowid NOT IN (SELECT rowid FROM entities "
                "WHERE tenant = ? AND session_id = ? ORDER BY last_seq DESC, rowid DESC LIMIT ?)",
                (tenant, session_id, tenant, session_id, keep),
            )

    @staticmethod
    def _messages(conn: Connection, tenant: str, session_id: str, since_seq: int) -> list[Message]:
        rows = conn.execute(
            f"SELECT {_MSG_COLS} FROM messages WHERE tenant = ? AND session_id = ? AND seq > ? ORDER BY seq",
            (tenant, session_id, since_seq),
        ).fetchall()
        return [_row_to_message(r) for r in rows]

    @staticmethod
    def _entities(conn: Connection, tenant: str, session_id: str) -> list[Entity]:
        rows = conn.execute(
            "SELECT kind, value, snippet, first_seq, last_seq FROM entities WHERE tenant = ? AND session_id = ? "
            "ORDER BY first_seq, rowid",
            (tenant, session_id),
        ).fetchall()
        return [Entity(r["kind"], r["value"], r["snippet"], r["first_seq"], r["last_seq"]) for r in rows]

    async def messages(self, tenant: str, user: str, session_id: str, since_seq: int = -1) -> list[Message]:
        """Messages with seq > ``since_seq``, in order.

        Raises:
            SessionNotFoundError: as :meth:`get` (ownership is checked in the same read).
        """

        def fn(conn: Connection) -> list[Message]:
            self._load(conn, tenant, user, session_id)
            return self._messages(conn, tenant, session_id, since_seq)

        return await self._call(fn)

    async def entities(self, tenant: str, user: str, session_id: str) -> list[Entity]:
        """The session's entity table, oldest first.

        Raises:
            SessionNotFoundError: as :meth:`get`.
        """

        def fn(conn: Connection) -> list[Entity]:
            self._load(conn, tenant, user, session_id)
            return self._entities(conn, tenant, session_id)

        return await self._call(fn)

    async def long_sessions(self, min_unsummarised: int) -> list[tuple[str, str, str, int]]:
        """``(session id, tenant, user, unsummarised)`` of every session (all tenants) with at least
        ``min_unsummarised`` messages not yet in its rolling summary, by (id, tenant): what the
        ``resummarise`` job refreshes. ``unsummarised = message_count - 1 - summary.until_seq``.
        One id may appear once per tenant (each tenant has its own session ids)."""

        def fn(conn: Connection) -> list[tuple[str, str, str, int]]:
            rows = conn.execute(
                "SELECT id, tenant, user_id, message_count - 1 - summary_until AS pending FROM sessions "
                "WHERE message_count - 1 - summary_until >= ? ORDER BY id, tenant",
                (min_unsummarised,),
            ).fetchall()
            return [(r[0], r[1], r[2], int(r[3])) for r in rows]

        return await self._call(fn)

    async def snapshot(
        self, tenant: str, user: str, session_id: str, *, with_entities: bool = True,
    ) -> tuple[Session, list[Message], list[Entity]]:
        """The session, all its messages and (``with_entities``) its entity table, read together.

        One call instead of ``get`` + ``messages`` + ``entities``: behind the state deployment each
        call is a round trip (~3 ms on 2 cores), and reading under one lock hold also means the
        three parts never straddle a concurrent append.

        Raises:
            SessionNotFoundError: as :meth:`get`.
        """

        def fn(conn: Connection) -> tuple[Session, list[Message], list[Entity]]:
            session = self._load(conn, tenant, user, session_id)
            entities = self._entities(conn, tenant, session_id) if with_entities else []
            return session, self._messages(conn, tenant, session_id, -1), entities

        return await self._call(fn)

    async def user_memory(self, tenant: str, user: str) -> list[dict[str, Any]]:
        """The user's carried constraints and facts (dicts: content, category, retention, created_at)."""

        def fn(conn: Connection) -> list[dict[str, Any]]:
            rows = conn.execute(
                "SELECT content, category, retention, created_at, source_session FROM user_memory "
                "WHERE tenant = ? AND user_id = ? ORDER BY created_at",
                (tenant, user),
            ).fetchall()
            return [dict(r) for r in rows]

        return await self._call(fn)

    # -- rolling summary ------------------------------------------------------------------
    async def save_summary(
        self, tenant: str, user: str, session_id: str, state: SummaryState, *, expected_until: int,
    ) -> bool:
        """Store a new summary if the stored one still covers ``expected_until`` (compare-and-set).

        Returns:
            False when another refresh got there first (this one is dropped).

        Raises:
            SessionNotFoundError: as :meth:`get` (e.g. deleted while the summary was written).
        """

        def fn(conn: Connection) -> bool:
            self._load(conn, tenant, user, session_id)
            cur = conn.execute(
                "UPDATE sessions SET summary = ?, summary_until = ?, summary_at = ?, summary_tokens = ?, "
                "summariser = ? WHERE tenant = ? AND id = ? AND summary_until = ?",
                (state.text, state.until_seq, state.updated_at, state.tokens, state.summariser, tenant, session_id,
                 expected_until),
            )
            return cur.rowcount == 1

        return await self._call(fn, write=True)
