"""SQLite session store: persistence, ownership, carry-over, compare-and-set, concurrency."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from recallserve.serve.context import (
    ContextManager,
    MessageIn,
    SessionNotFoundError,
    SessionStore,
    SummaryState,
)

from .conftest import run


def test_survives_restart_and_uses_wal(tmp_path: Path) -> None:
    path = tmp_path / "db" / "ctx.sqlite3"

    async def write() -> None:
        store = SessionStore(path)
        mgr = ContextManager(store)
        s = await mgr.open_session("acme", "alice", "s1", mode="hybrid")
        await mgr.append(s, [MessageIn(role="user", content="My order number is ORD-1234567."),
                             MessageIn(role="assistant", content="Noted.")])
        store.close()

    async def read() -> None:
        store = SessionStore(path)
        s = await store.get("acme", "alice", "s1")
        assert s.mode == "hybrid" and s.message_count == 2
        msgs = await store.messages("acme", "alice", "s1")
        assert [(m.seq, m.role, m.category, m.retention) for m in msgs] == [
            (0, "user", "fact", 1), (1, "assistant", "chat", 1)]
        assert msgs[0].tokens > 0
        assert [(e.kind, e.value, e.first_seq) for e in await store.entities("acme", "alice", "s1")] == [("id", "ORD-1234567", 0)]
        store.close()

    run(write())
    run(read())
    mode = sqlite3.connect(path).execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"


def test_other_user_of_the_tenant_gets_not_found(store: SessionStore) -> None:
    run(store.open("acme", "alice", "s1"))
    with pytest.raises(SessionNotFoundError, match="'s1' not found"):
        run(store.get("acme", "bob", "s1"))
    # nor can the id be taken over inside the tenant by opening it
    with pytest.raises(SessionNotFoundError):
        run(store.open("acme", "bob", "s1"))
    for call in (store.messages("acme", "bob", "s1"), store.entities("acme", "bob", "s1"),
                 store.set_mode("acme", "bob", "s1", "full"), store.delete("acme", "bob", "s1"),
                 store.save_summary("acme", "bob", "s1", SummaryState(text="x", until_seq=0), expected_until=-1)):
        with pytest.raises(SessionNotFoundError):
            run(call)
    with pytest.raises(SessionNotFoundError):
        run(store.get("acme", "alice", "missing"))


def test_session_ids_are_per_tenant(manager: ContextManager) -> None:
    """Tenant B opening "s1" first neither locks tenant A out nor shares anything with A's "s1"."""
    store = manager.store

    async def go() -> None:
        fresh_error = None
        try:
            await store.get("acme", "alice", "s1")
        except SessionNotFoundError as exc:
            fresh_error = str(exc)
        b = await manager.open_session("globex", "mallory", "s1", mode="full")
        await manager.append(b, [MessageIn(role="user", content="Never call me before 9am. Order ORD-1111111.")])
        # another tenant's id reads exactly as a fresh one: same error text
        with pytest.raises(SessionNotFoundError) as err:
            await store.get("acme", "alice", "s1")
        assert str(err.value) == fresh_error
        a = await manager.open_session("acme", "alice", "s1")
        assert (a.tenant, a.user, a.message_count, a.mode) == ("acme", "alice", 0, None)
        await manager.append(a, [MessageIn(role="user", content="My order is ORD-2222222.")])
        assert [m.content for m in await store.messages("acme", "alice", "s1")] == ["My order is ORD-2222222."]
        assert [e.value for e in await store.entities("acme", "alice", "s1")] == ["ORD-2222222"]
        assert "ORD-1111111" in [e.value for e in await store.entities("globex", "mallory", "s1")]
        state = SummaryState(text="- a", until_seq=0, updated_at=1.0, tokens=2, summariser="x")
        assert await store.save_summary("acme", "alice", "s1", state, expected_until=-1) is True
        assert (await store.get("globex", "mallory", "s1")).summary.text == ""
        assert [(sid, t) for sid, t, _u, _n in await store.long_sessions(1)] == [("s1", "globex")]
        await store.delete("globex", "mallory", "s1")
        assert (await store.get("acme", "alice", "s1")).message_count == 1
        assert not manager.is_refreshing(a)

    run(go())


def _old_schema_file(path: Path) -> None:
    """A session file as written before the tenant key (schema version 0), with one session."""
    conn = sqlite3.connect(path)
    conn.executescript("""
    CREATE TABLE sessions (id TEXT PRIMARY KEY, tenant TEXT NOT NULL, user_id TEXT NOT NULL,
        created_at REAL NOT NULL, mode TEXT, message_count INTEGER NOT NULL DEFAULT 0,
        summary TEXT NOT NULL DEFAULT '', summary_until INTEGER NOT NULL DEFAULT -1,
        summary_at REAL NOT NULL DEFAULT 0, summary_tokens INTEGER NOT NULL DEFAULT 0,
        summariser TEXT NOT NULL DEFAULT '');
    CREATE INDEX sessions_owner ON sessions (tenant, user_id, created_at);
    CREATE TABLE messages (session_id TEXT NOT NULL, seq INTEGER NOT NULL, id TEXT NOT NULL UNIQUE,
        role TEXT NOT NULL, content TEXT NOT NULL, timestamp REAL NOT NULL, category TEXT NOT NULL,
        retention INTEGER NOT NULL, tokens INTEGER NOT NULL, tool_name TEXT, source_session TEXT,
        PRIMARY KEY (session_id, seq));
    CREATE TABLE entities (session_id TEXT NOT NULL, kind TEXT NOT NULL, value TEXT NOT NULL,
        snippet TEXT NOT NULL, first_seq INTEGER NOT NULL, last_seq INTEGER NOT NULL,
        PRIMARY KEY (session_id, kind, value));
    CREATE TABLE user_memory (tenant TEXT NOT NULL, user_id TEXT NOT NULL, key TEXT NOT NULL,
        role TEXT NOT NULL, content TEXT NOT NULL, category TEXT NOT NULL, retention INTEGER NOT NULL,
        tokens INTEGER NOT NULL, created_at REAL NOT NULL, source_session TEXT NOT NULL,
        PRIMARY KEY (tenant, user_id, key));
    INSERT INTO sessions VALUES ('old-1', 'acme', 'alice', 5.0, 'hybrid', 2, '- kept', 0, 6.0, 3, 'extractive');
    INSERT INTO messages VALUES ('old-1', 0, 'm0', 'user', 'My order is ORD-3333333.', 5.0, 'fact', 2, 9, NULL, NULL);
    INSERT INTO messages VALUES ('old-1', 1, 'm1', 'assistant', 'Noted.', 5.5, 'chat', 1, 5, NULL, NULL);
    INSERT INTO messages VALUES ('gone', 0, 'm2', 'user', 'orphan of a deleted session', 1.0, 'chat', 1, 5, NULL, NULL);
    INSERT INTO entities VALUES ('old-1', 'id', 'ORD-3333333', 'My order is ORD-3333333.', 0, 0);
    INSERT INTO user_memory VALUES ('acme', 'alice', 'k', 'user', 'My order is ORD-3333333.', 'fact', 2, 9, 5.0, 'old-1');
    """)
    conn.commit()
    conn.close()


def test_old_schema_file_is_migrated_and_keeps_its_sessions(tmp_path: Path) -> None:
    path = tmp_path / "sessions.sqlite3"
    _old_schema_file(path)

    async def go() -> None:
        store = SessionStore(path)
        s = await store.get("acme", "alice", "old-1")
        assert (s.mode, s.message_count, s.summary.text, s.summary.until_seq) == ("hybrid", 2, "- kept", 0)
        assert [(m.seq, m.id, m.content) for m in await store.messages("acme", "alice", "old-1")] == [
            (0, "m0", "My order is ORD-3333333."), (1, "m1", "Noted.")]
        assert [e.value for e in await store.entities("acme", "alice", "old-1")] == ["ORD-3333333"]
        # the migrated file takes new writes and is tenant-keyed: another tenant's "old-1" is its own
        mgr = ContextManager(store)
        await mgr.append(s, [MessageIn(role="user", content="And the ticket is T-77.")])
        other = await mgr.open_session("globex", "bob", "old-1")
        assert other.message_count == 0
        store.close()
        again = SessionStore(path)  # a second open is a no-op (already version 1)
        assert (await again.get("acme", "alice", "old-1")).message_count == 3
        again.close()

    run(go())
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 1
    assert conn.execute("SELECT COUNT(*) FROM messages WHERE session_id = 'gone'").fetchone()[0] == 0
    names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
    assert "sessions_owner" in names and not {n for n in names if n.startswith("v0_")}


def test_snapshot_reads_session_messages_and_entities_together(manager: ContextManager) -> None:
    store = manager.store
    s = run(manager.open_session("acme", "alice", "s1"))
    run(manager.append(s, [MessageIn(role="user", content="Order 104208 is late."),
                           MessageIn(role="assistant", content="Checking.")]))
    session, messages, entities = run(store.snapshot("acme", "alice", "s1"))
    assert session == run(store.get("acme", "alice", "s1"))
    assert messages == run(store.messages("acme", "alice", "s1")) and len(messages) == 2
    assert entities == run(store.entities("acme", "alice", "s1")) and "104208" in {e.value for e in entities}
    assert run(store.snapshot("acme", "alice", "s1", with_entities=False))[2] == []
    with pytest.raises(SessionNotFoundError):  # ownership as for get: no messages of another tenant
        run(store.snapshot("evil", "alice", "s1"))


def test_new_session_starts_with_users_constraints_and_facts(manager: ContextManager) -> None:
    async def go() -> None:
        s1 = await manager.open_session("acme", "alice", "first")
        await manager.append(s1, [
            MessageIn(role="user", content="Never call me before 9am."),
            MessageIn(role="user", content="My order number is ORD-7654321."),
            MessageIn(role="user", content="How long does shipping take?"),
            MessageIn(role="assistant", content="You must restart the app; refund of $5.00 issued."),
        ])
        s2 = await manager.open_session("acme", "alice", "second")
        carried = await manager.store.messages("acme", "alice", s2.id)
        assert [(m.content, m.retention, m.source_session) for m in carried] == [
            ("Never call me before 9am.", 2, "first"), ("My order number is ORD-7654321.", 1, "first")]
        assert s2.message_count == 2
        # another user of the same tenant starts empty
        other = await manager.open_session("acme", "bob", "third")
        assert await manager.store.messages("acme", "bob", other.id) == []
        # carried messages show up in the new session's context with their origin
        res = await manager.assemble(s2, [MessageIn(role="user", content="hi")], context_window=2048,
                                     reserved_output=128, mode="sliding")
        text = "\n".join([res.block, *(m.content for m in res.window)])
        assert "Never call me before 9am." in text

    run(go())


def test_summary_compare_and_set(store: SessionStore) -> None:
    run(store.open("t", "u", "s"))
    new = SummaryState(text="- a", until_seq=5, updated_at=1.0, tokens=2, summariser="x")
    assert run(store.save_summary("t", "u", "s", new, expected_until=-1)) is True
    # a second refresh that started from the old state loses
    assert run(store.save_summary("t", "u", "s", new.model_copy(update={"text": "- b"}), expected_until=-1)) is False
    assert run(store.get("t", "u", "s")).summary.text == "- a"


def test_concurrent_appends_get_unique_seqs(manager: ContextManager) -> None:
    async def go() -> None:
        s = await manager.open_session("t", "u", "s")
        await asyncio.gather(*[
            manager.append(s, [MessageIn(role="user", content=f"message {i}")]) for i in range(20)])
        msgs = await manager.store.messages("t", "u", "s")
        assert sorted(m.seq for m in msgs) == list(range(20))
        assert (await manager.store.get("t", "u", "s")).message_count == 20

    run(go())


def test_delete(store: SessionStore) -> None:
    run(store.open("t", "u", "s"))
    run(store.delete("t", "u", "s"))
    with pytest.raises(SessionNotFoundError):
        run(store.get("t", "u", "s"))
