"""Erasure with state in a real PostgreSQL 15 leaves no erased byte in the cluster's files.

The server is this test's own (its data folder is what is grepped), started with
``wal_recycle=off`` so that a retired WAL segment is unlinked, not renamed for reuse with its old
bytes. Strings are planted for two users through every state store (session messages, carried
facts, trace question/answer, experience record) and the erasure log; after the erasure of one
user is ``done`` (each store's ``VACUUM FULL``) and a ``CHECKPOINT`` has written every dirty page,
no file of the data folder outside ``pg_wal`` holds that user's strings or key; the other user's
are all there. ``pg_wal`` still holds them (what PostgreSQL's WAL keeps: asserted, so the docs'
statement stays true) until two checkpoints past a WAL switch retire those segments, which is
the operator's step in ``docs/erasure.md``; the server's log never holds them.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path

import numpy as np
import psycopg
import pytest

from recallserve.serve.context import SessionStore
from recallserve.serve.context._types import Message
from recallserve.serve.erasure import ErasureLog, ErasureService, OwnedStore
from recallserve.serve.experience import ExperienceStore
from recallserve.serve.experience._schema import ExperienceRecord
from recallserve.serve.statedb import PostgresDatabase
from recallserve.serve.traces import TraceStore
from recallserve.serve.traces._models import TurnTrace

from .experience._records import speed_record

pytestmark = pytest.mark.slow


def _holding(folder: Path, needle: str) -> list[str]:
    raw = needle.encode()
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file() and raw in p.read_bytes())


async def _plant(sessions: SessionStore, traces: TraceStore, exps: ExperienceStore, user: str, tag: str) -> None:
    for i in range(40):  # NOTE: several heap pages per table, so whole pages and shared pages both occur
        session = await sessions.open("acme", user, f"s-{tag}-{i}")
        msg = Message(id=f"m-{tag}-{i}", seq=-1, role="user", content=f"I live at {tag}-street {i}, my cat is {tag}-cat",
                      timestamp=1.0, category="fact", retention=2, tokens=9)
        await sessions.append(session, [msg], [[]])
        await traces.put("acme", TurnTrace(id=f"t-{tag}-{i}", created_at=time.time(), user=user,
                                           question=f"{tag}-question {i}", answer=f"{tag}-answer {i}", path="plain",
                                           finish_reason="stop"))
    rec = speed_record(text=f"A car of {tag}-car drives 120 km in 1.5 h. What is its speed?")
    rec["metadata"]["user"] = user
    await exps.put("acme", ExperienceRecord.model_validate(rec), tier="active", family="f",
                   embedding=np.ones(4, dtype=np.float32), last_used_at=1.0)


def test_no_file_of_the_postgres_cluster_keeps_an_erased_users_text() -> None:
    from tests._postgres import postgres_server

    root = Path(tempfile.mkdtemp(prefix="rs-pgdisk-"))
    with postgres_server(root, "-c wal_recycle=off -c full_page_writes=on") as dsn:
        data = root / "data"

        def sql(*statements: str) -> None:
            with psycopg.connect(dsn, autocommit=True) as conn:
                for stmt in statements:
                    conn.execute(stmt)  # type: ignore[arg-type]

        async def run() -> None:
            db = PostgresDatabase(dsn, pool_size=2)
            sessions, traces, exps = SessionStore(db=db), TraceStore(db=db), ExperienceStore(db=db)
            log = ErasureLog(db=db)
            await _plant(sessions, traces, exps, "zqgone-user", "zqgone")
            await _plant(sessions, traces, exps, "zqkeep-user", "zqkeep")
            stores: dict[str, OwnedStore] = {"sessions": sessions, "turns": traces, "experiences": exps}
            service = ErasureService(log, [], stores)
            # NOTE: the control: written to the heap files, the planted text is found there.
            sql("CHECKPOINT")
            assert _holding(data / "base", "zqgone-cat") and _holding(data / "base", "zqgone-car")
            row = await service.request("acme", "zqgone-user", "key_x")
            await service.wait(row.id)
            done = await log.get("acme", row.id)
            assert done is not None and done.status == "done", done
            assert done.counts["sessions"] == 40 and done.counts["turns"] == 40 and done.counts["experiences"] == 1
            assert (await sessions.export_user("acme", "zqkeep-user"))["sessions"]
            db.close()

        asyncio.run(run())
        sql("CHECKPOINT")
        outside_wal = [p for p in data.iterdir() if p.name != "pg_wal"]
        for needle in ("zqgone", "zqgone-user"):
            held = [f for p in outside_wal for f in (_holding(p, needle) if p.is_dir() else [])]
            assert held == [], f"{needle!r} still in {held}"
        for needle in ("zqkeep-cat", "zqkeep-answer", "zqkeep-car", "zqkeep-user"):
            assert _holding(data / "base", needle), needle
        # NOTE: PostgreSQL's WAL: the inserts are still there after the erasure ...
        assert _holding(data / "pg_wal", "zqgone-cat")
        # ... until the segments that hold them are retired: a switch, then checkpoints past it.
        sql("SELECT pg_switch_wal()", "CHECKPOINT", "SELECT pg_switch_wal()", "CHECKPOINT")
        assert _holding(data / "pg_wal", "zqgone") == []
        assert _holding(data / "pg_wal", "zqkeep-cat") == []  # NOTE: retired for everyone: not a per-user step
        assert b"zqgone" not in (root / "log").read_bytes()
