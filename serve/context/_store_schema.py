"""Tables of the session store and the migration of files written by older versions.

``PRAGMA user_version`` holds the schema version of a file. Version 0 (files written before the
tenant key) had one namespace of session ids across tenants: ``sessions.id`` was the primary key
and messages and entities hung off the bare id. Version 1 keys all three by tenant first, so
each tenant has its own session ids (see :mod:`recallserve.serve.context._store`).
"""

from __future__ import annotations

import sqlite3

__all__ = ["MSG_COLS", "SCHEMA_VERSION", "ensure_schema"]

# NOTE: version 1 = sessions, messages and entities keyed by tenant first (version 0, the files
# written before it, had one namespace of session ids across tenants); PRAGMA user_version holds it.
SCHEMA_VERSION = 1
_SESSION_TABLES = """
CREATE TABLE IF NOT EXISTS sessions (
    tenant TEXT NOT NULL, id TEXT NOT NULL, user_id TEXT NOT NULL, created_at REAL NOT NULL,
    mode TEXT, message_count INTEGER NOT NULL DEFAULT 0,
    summary TEXT NOT NULL DEFAULT '', summary_until INTEGER NOT NULL DEFAULT -1,
    summary_at REAL NOT NULL DEFAULT 0, summary_tokens INTEGER NOT NULL DEFAULT 0,
    summariser TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (tenant, id)
);
CREATE INDEX IF NOT EXISTS sessions_owner ON sessions (tenant, user_id, created_at);
CREATE TABLE IF NOT EXISTS messages (
    tenant TEXT NOT NULL, session_id TEXT NOT NULL, seq INTEGER NOT NULL, id TEXT NOT NULL, role TEXT NOT NULL,
    content TEXT NOT NULL, timestamp REAL NOT NULL, category TEXT NOT NULL, retention INTEGER NOT NULL,
    tokens INTEGER NOT NULL, tool_name TEXT, source_session TEXT,
    PRIMARY KEY (tenant, session_id, seq), UNIQUE (tenant, id)
);
CREATE TABLE IF NOT EXISTS entities (
    tenant TEXT NOT NULL, session_id TEXT NOT NULL, kind TEXT NOT NULL, value TEXT NOT NULL, snippet TEXT NOT NULL,
    first_seq INTEGER NOT NULL, last_seq INTEGER NOT NULL,
    PRIMARY KEY (tenant, session_id, kind, value)
);
"""
_SCHEMA = _SESSION_TABLES + """
CREATE TABLE IF NOT EXISTS user_memory (
    tenant TEXT NOT NULL, user_id TEXT NOT NULL, key TEXT NOT NULL, role TEXT NOT NULL,
    content TEXT NOT NULL, category TEXT NOT NULL, retention INTEGER NOT NULL, tokens INTEGER NOT NULL,
    created_at REAL NOT NULL, source_session TEXT NOT NULL,
    PRIMARY KEY (tenant, user_id, key)
);
"""
MSG_COLS = "seq, id, role, content, timestamp, category, retention, tokens, tool_name, source_session"


def _statements(script: str) -> list[str]:
    # NOTE: executescript() would COMMIT first; one statement at a time keeps them in our transaction.
    return [stmt.strip() for stmt in script.split(";") if stmt.strip()]


def _migrate_v0(conn: sqlite3.Connection) -> None:
    """Rewrite a version-0 file (session ids global) to tenant-keyed tables, keeping every session.

    Messages and entities take their tenant from their session; rows of no session (unreachable
    before too) are dropped. Runs inside the caller's transaction: a crash leaves the old file.
    """
    conn.execute("DROP INDEX IF EXISTS sessions_owner")  # NOTE: it would follow the renamed table
    for table in ("sessions", "messages", "entities"):
        conn.execute(f"ALTER TABLE {table} RENAME TO v0_{table}")
    for stmt in _statements(_SESSION_TABLES):
        conn.execute(stmt)
    cols = ("id, user_id, created_at, mode, message_count, summary, summary_until, summary_at, summary_tokens, "
            "summariser")
    conn.execute(f"INSERT INTO sessions (tenant, {cols}) SELECT tenant, {cols} FROM v0_sessions")
    msg = ", ".join(f"m.{c.strip()}" for c in MSG_COLS.split(","))
    conn.execute(f"INSERT INTO messages (tenant, session_id, {MSG_COLS}) SELECT s.tenant, m.session_id, {msg} "
                 "FROM v0_messages m JOIN v0_sessions s ON s.id = m.session_id")
    conn.execute("INSERT INTO entities (tenant, session_id, kind, value, snippet, first_seq, last_seq) "
                 "SELECT s.tenant, e.session_id, e.kind, e.value, e.snippet, e.first_seq, e.last_seq "
                 "FROM v0_entities e JOIN v0_sessions s ON s.id = e.session_id")
    for table in ("sessions", "messages", "entities"):
        conn.execute(f"DROP TABLE v0_{table}")


def ensure_schema(conn: sqlite3.Connection) -> None:
    """Create the tables, or bring an older file up to :data:`SCHEMA_VERSION`."""
    if conn.execute("PRAGMA user_version").fetchone()[0] >= SCHEMA_VERSION:
        return
    keys = [r["name"] for r in conn.execute("PRAGMA table_info(sessions)") if r["pk"]]
    if keys == ["id"]:
        _migrate_v0(conn)
    for stmt in _statements(_SCHEMA):
        conn.execute(stmt)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
