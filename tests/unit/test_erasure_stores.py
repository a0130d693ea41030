"""The SQLite side of erasure, without a model: each store's ``erase_user`` / ``export_user`` walk
the same rows, leave other users' rows, and leave no byte of the erased rows in the database file
or its ``-wal`` (``secure_delete`` + ``wal_checkpoint(TRUNCATE)``); the erasure log forgets the user
key once done and is idempotent while pending; a restart resumes an unfinished erasure."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np

from recallserve.memory_shards import HashingEmbedder
from recallserve.memory_shards.retrieval import local_hybrid_coordinator
from recallserve.serve.context import SessionStore
from recallserve.serve.context._types import Message
from recallserve.serve.erasure import ErasureLog, ErasureService, user_hash
from recallserve.serve.experience import ExperienceStore
from recallserve.serve.experience._schema import ExperienceRecord
from recallserve.serve.memory_api import MemoryService
from recallserve.serve.memory_api.schemas import FiltersIn, MemoryIn, SearchRequest
from recallserve.serve.traces import TraceStore
from recallserve.serve.traces._models import TurnTrace

from .experience._records import speed_record


def _bytes_hold(folder: Path, needle: str) -> list[str]:
    raw = needle.encode()
    return [p.name for p in folder.rglob("*") if p.is_file() and raw in p.read_bytes()]


async def _sessions(store: SessionStore, user: str, tag: str) -> None:
    session = await store.open("acme", user, f"s-{tag}")
    msg = Message(id=f"m-{tag}", seq=-1, role="user", content=f"I live at {tag}-street and my cat is {tag}-cat",
                  timestamp=1.0, category="fact", retention=2, tokens=9)
    await store.append(session, [msg], [[]])


def test_session_store_erases_and_exports_one_users_sessions(tmp_path: Path) -> None:
    async def run() -> None:
        store = SessionStore(tmp_path / "sessions.sqlite3")
        for user, tag in (("u1", "zqone"), ("u2", "zqtwo")):
            for i in range(30):  # NOTE: enough rows for several pages, so deletes free whole pages too
                await _sessions(store, user, f"{tag}{i}")
        exported = await store.export_user("acme", "u1")
        assert len(exported["sessions"]) == 30 and "zqone0-cat" in str(exported)
        assert "zqtwo" not in str(exported)
        counts = await store.erase_user("acme", "u1")
        assert counts["sessions"] == 30 and counts["messages"] >= 30 and counts["user_memory"] >= 1
        assert await store.export_user("acme", "u1") == {"sessions": [], "user_memory": []}
        assert len((await store.export_user("acme", "u2"))["sessions"]) == 30
        store.close()

    asyncio.run(run())
    assert _bytes_hold(tmp_path, "zqone") == []
    assert _bytes_hold(tmp_path, "zqtwo0-cat")


def test_trace_and_experience_stores_erase_by_owner(tmp_path: Path) -> None:
    async def run() -> None:
        traces = TraceStore(tmp_path / "turns.sqlite3")
        exps = ExperienceStore(tmp_path)
        for user, tag in (("u1", "zqone"), ("u2", "zqtwo")):
            await traces.put("acme", TurnTrace(id=f"t-{tag}", created_at=time.time(), user=user, question=f"{tag}-question",
                                               answer=f"{tag}-answer", path="plain", finish_reason="stop"))
            rec = speed_record(text=f"A car of {tag}-car drives 120 km in 1.5 h. What is its speed?")
            rec["metadata"]["user"] = user
            await exps.put("acme", ExperienceRecord.model_validate(rec), tier="active", family="f",
                           embedding=np.ones(4, dtype=np.float32), last_used_at=1.0)
        assert "zqone-answer" in str(await traces.export_user("acme", "u1"))
        assert (await traces.erase_user("acme", "u1")) == {"turns": 1}
        assert (await exps.erase_user("acme", "u1"))["experiences"] == 1
        assert (await exps.export_user("acme", "u1")) == {"experiences": []}
        assert len((await exps.export_user("acme", "u2"))["experiences"]) == 1
        traces.close()
        exps.close()

    asyncio.run(run())
    assert _bytes_hold(tmp_path, "zqone") == []
    assert _bytes_hold(tmp_path, "zqtwo-answer") and _bytes_hold(tmp_path, "zqtwo-car")


EMB = HashingEmbedder(64)


async def embed(texts: list[str]):  # type: ignore[no-untyped-def]
    return EMB.embed(texts)


def test_erasure_log_is_idempotent_forgets_the_user_and_resumes_after_a_restart(tmp_path: Path) -> None:
    emb = EMB

    async def run() -> None:
        coord = local_hybrid_coordinator(2, emb.model_id, emb.dim, data_root=tmp_path / "memory")
        memory = MemoryService(coord, embed, threshold=0.0)
        await memory.add("acme", [MemoryIn(text="zqone-note about the pier", user="zqone-user"),
                                  MemoryIn(text="zqtwo-note about the pier", user="zqtwo-user"),
                                  MemoryIn(text="tenant handbook about the pier")])
        scoped = await memory.search_request("acme", SearchRequest(query="pier", filters=FiltersIn(user="zqone-user")))
        assert [h.record.text for h in scoped] == ["zqone-note about the pier"]
        with_tenant = await memory.search("acme", "pier", user="zqone-user")
        assert sorted(h.record.text for h in with_tenant) == ["tenant handbook about the pier",
                                                              "zqone-note about the pier"]
        log = ErasureLog(tmp_path / "state" / "erasures.sqlite3")
        # NOTE: as a crash right after the request was logged: the row is pending, nothing ran.
        row, created = await log.begin("acme", "zqone-user", user_hash("acme", "zqone-user"), "key_x")
        again, created_again = await log.begin("acme", "zqone-user", user_hash("acme", "zqone-user"), "key_x")
        assert created and not created_again and again.id == row.id
        service = ErasureService(log, memory.coordinators(), {})
        assert await service.resume() == 1
        await service.wait(row.id)
        done = await log.get("acme", row.id)
        assert done is not None and done.status == "done" and done.counts == {"memories": 1}
        assert await log.get("globex", row.id) is None
        assert [h.record.text for h in await memory.search("acme", "pier", user="zqone-user")] == [
            "tenant handbook about the pier"]
        log.close()
        for c in coord.shards:
            c.shard.close()

    asyncio.run(run())
    assert _bytes_hold(tmp_path, "zqone") == []
    assert _bytes_hold(tmp_path, "zqtwo-note")


def test_a_write_back_landing_between_the_passes_is_erased_before_done(tmp_path: Path) -> None:
    emb = EMB

    async def run() -> None:
        coord = local_hybrid_coordinator(1, emb.model_id, emb.dim, data_root=tmp_path / "memory")
        memory = MemoryService(coord, embed, threshold=0.0)
        await memory.add("acme", [MemoryIn(text="zqone first note", user="u1")])
        log = ErasureLog(tmp_path / "erasures.sqlite3")
        service = ErasureService(log, memory.coordinators(), {}, settle_s=0.5)
        row = await service.request("acme", "u1", "key_x")
        await asyncio.sleep(0.2)  # NOTE: the first pass is done; a turn in flight stores its write-back now
        await memory.add("acme", [MemoryIn(text="zqone late write-back", user="u1")])
        assert (await log.get("acme", row.id)).status == "pending"
        await service.wait(row.id)
        done = await log.get("acme", row.id)
        assert done.status == "done" and done.counts == {"memories": 2}
        assert await coord.owned("acme", "u1") == []
        log.close()
        for c in coord.shards:
            c.shard.close()

    asyncio.run(run())
    assert _bytes_hold(tmp_path, "zqone") == []


def test_a_log_file_from_before_the_leases_gets_their_columns_and_resumes(tmp_path: Path) -> None:
    """An ``erasures.sqlite3`` written by the previous release (no ``runner`` / ``lease_until``) is
    upgraded in place; its pending erasure is claimed and finished."""
    import sqlite3

    path = tmp_path / "erasures.sqlite3"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE erasures (id TEXT PRIMARY KEY, kind TEXT NOT NULL, tenant TEXT NOT NULL, "
                     "user_key TEXT, user_hash TEXT NOT NULL, requester TEXT NOT NULL, status TEXT NOT NULL, "
                     "attempts INTEGER NOT NULL DEFAULT 0, counts TEXT NOT NULL, error TEXT, created_at REAL NOT NULL, "
                     "done_at REAL)")
        conn.execute("INSERT INTO erasures VALUES ('er_old', 'erasure', 'acme', 'u1', 'h', 'key_x', 'pending', 1, "
                     "'{}', NULL, 1.0, NULL)")

    async def run() -> None:
        log = ErasureLog(path)
        service = ErasureService(log, [], {})
        assert await service.resume() == 1
        await service.wait("er_old")
        row = await log.get("acme", "er_old")
        assert row is not None and row.status == "done" and row.attempts == 2
        log.close()

    asyncio.run(run())
