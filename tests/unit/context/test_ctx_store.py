"""SQLite session store: persistence, ownership, carry-over, compare-and-set, concurrency."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from serve.context import (
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
        msgs = await store.messages("s1")
        assert [(m.seq, m.role, m.category, m.retention) for m in msgs] == [
            (0, "user", "fact", 2), (1, "assistant", "chat", 1)]
        assert msgs[0].tokens > 0
        assert [(e.kind, e.value, e.first_seq) for e in await store.entities("s1")] == [("id", "ORD-1234567", 0)]
        store.close()

    run(write())
    run(read())
    mode = sqlite3.connect(path).execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"


def test_other_tenant_or_user_gets_not_found(store: SessionStore) -> None:
    run(store.open("acme", "alice", "s1"))
    for tenant, user in [("evil", "alice"), ("acme", "bob")]:
        with pytest.raises(SessionNotFoundError, match="'s1' not found"):
            run(store.get(tenant, user, "s1"))
        # nor can the id be taken over by opening it
        with pytest.raises(SessionNotFoundError):
            run(store.open(tenant, user, "s1"))
    with pytest.raises(SessionNotFoundError):
        run(store.get("acme", "alice", "missing"))


def test_snapshot_reads_session_messages_and_entities_together(manager: ContextManager) -> None:
    store = manager.store
    s = run(manager.open_session("acme", "alice", "s1"))
    run(manager.append(s, [MessageIn(role="user", content="Order 104208 is late."),
                           MessageIn(role="assistant", content="Checking.")]))
    session, messages, entities = run(store.snapshot("acme", "alice", "s1"))
    assert session == run(store.get("acme", "alice", "s1"))
    assert messages == run(store.messages("s1")) and len(messages) == 2
    assert entities == run(store.entities("s1")) and "104208" in {e.value for e in entities}
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
        carried = await manager.store.messages(s2.id)
        assert [(m.content, m.retention, m.source_session) for m in carried] == [
            ("Never call me before 9am.", 3, "first"), ("My order number is ORD-7654321.", 2, "first")]
        assert s2.message_count == 2
        # another user of the same tenant starts empty
        other = await manager.open_session("acme", "bob", "third")
        assert await manager.store.messages(other.id) == []
        # carried messages show up in the new session's context with their origin
        res = await manager.assemble(s2, [MessageIn(role="user", content="hi")], context_window=2048,
                                     reserved_output=128, mode="sliding")
        text = "\n".join(m.content for m in res.messages)
        assert "Never call me before 9am." in text

    run(go())


def test_summary_compare_and_set(store: SessionStore) -> None:
    run(store.open("t", "u", "s"))
    new = SummaryState(text="- a", until_seq=5, updated_at=1.0, tokens=2, summariser="x")
    assert run(store.save_summary("s", new, expected_until=-1)) is True
    # a second refresh that started from the old state loses
    assert run(store.save_summary("s", new.model_copy(update={"text": "- b"}), expected_until=-1)) is False
    assert run(store.get("t", "u", "s")).summary.text == "- a"


def test_concurrent_appends_get_unique_seqs(manager: ContextManager) -> None:
    async def go() -> None:
        s = await manager.open_session("t", "u", "s")
        await asyncio.gather(*[
            manager.append(s, [MessageIn(role="user", content=f"message {i}")]) for i in range(20)])
        msgs = await manager.store.messages("s")
        assert sorted(m.seq for m in msgs) == list(range(20))
        assert (await manager.store.get("t", "u", "s")).message_count == 20

    run(go())


def test_delete(store: SessionStore) -> None:
    run(store.open("t", "u", "s"))
    run(store.delete("t", "u", "s"))
    with pytest.raises(SessionNotFoundError):
        run(store.get("t", "u", "s"))
