"""The state database under the session, experience and trace stores, on both backends.

The experience store's every method on each backend (tenant-keyed, upsert, touch keeps a label
stored in between, expiry, freshness); PostgreSQL's versioned migrations run once and wait on
the advisory lock (two replicas starting together do not race); a database that cannot be
reached is a :class:`StateUnavailableError` (503 on the API), not a hang.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from recallserve.serve.context import SessionStore
from recallserve.serve.context._types import Message
from recallserve.serve.experience import ExperienceRecord, ExperienceStore
from recallserve.serve.statedb import MIGRATION_LOCK, Row, SqliteDatabase, StateUnavailableError
from recallserve.serve.traces import TraceStore
from tests.unit.experience._records import speed_record


def _record(exp_id: str, domain: str = "units", **kw: Any) -> ExperienceRecord:
    return ExperienceRecord.model_validate(speed_record(exp_id=exp_id, domain=domain, **kw))


def test_the_experience_store_is_tenant_keyed_and_complete_on_each_backend(tmp_path: Path, state_db: Any) -> None:
    store = ExperienceStore(tmp_path / "exp", db=state_db)
    emb = np.arange(4, dtype=np.float32)
    now = time.time()

    async def scenario() -> None:
        await store.put("acme", _record("e1", timestamp=now - 10), tier="active", family="qwen", embedding=emb,
                        last_used_at=now - 10)
        await store.put("acme", _record("e2", domain="tax", timestamp=now - 5, expires_at=now - 1), tier="active",
                        family="qwen", embedding=emb, last_used_at=now - 5)
        await store.put("globex", _record("e1", timestamp=now), tier="review", family="qwen", embedding=emb * 2,
                        last_used_at=now)
        got = await store.get("acme", "e1")
        assert got is not None and got.tenant == "acme" and got.tier == "active"
        assert np.array_equal(got.embedding, emb) and got.embedding.dtype == np.float32
        assert (await store.get("globex", "e1")).tier == "review"  # type: ignore[union-attr]
        assert await store.get("globex", "e2") is None  # another tenant's id reads as absent
        # same tenant and id overwrites (upsert on both backends)
        await store.put("acme", _record("e1", timestamp=now - 10, label="correct"), tier="active", family="qwen",
                        embedding=emb, last_used_at=now - 3)
        assert (await store.get("acme", "e1")).record.evaluation.human_label == "correct"  # type: ignore[union-attr]
        assert [r.id for r in await store.query("acme", tiers=["active"], now=now)] == ["e1"]  # e2 expired
        assert [r.id for r in await store.query("acme", tiers=["active"], topic_prefix="physics")] == ["e1", "e2"]
        assert await store.query("acme", tiers=["active"], topic_prefix="phys") == []  # a prefix is whole segments
        assert [d for d, _ in await store.active_domains("acme")] == ["units", "tax"]
        # touch writes only the score into the record as stored now (the label above stays)
        stale = _record("e1").model_copy(deep=True)
        stale.evaluation.retrieval_score = 0.75
        await store.touch("acme", [("e1", now, stale.model_dump_json())])
        touched = await store.get("acme", "e1")
        assert touched is not None and touched.use_count == 1 and touched.last_used_at == pytest.approx(now)
        assert touched.record.evaluation.retrieval_score == 0.75 and touched.record.evaluation.human_label == "correct"
        await store.touch("acme", [("e1", now, json.dumps({"evaluation": {"retrieval_score": None}}))])
        assert (await store.get("acme", "e1")).record.evaluation.retrieval_score is None  # type: ignore[union-attr]
        await store.set_tier("acme", ["e1"], "archival")
        assert (await store.get("acme", "e1")).tier == "archival"  # type: ignore[union-attr]
        assert (await store.get("globex", "e1")).tier == "review"  # type: ignore[union-attr]
        assert await store.tenants() == ["acme", "globex"]
        assert await store.active_freshness(now, 1.0) == pytest.approx(1.0 / (1.0 + 5 / 86400.0))
        assert await store.archive_expired(now) == 1 and (await store.get("acme", "e2")).tier == "archival"  # type: ignore[union-attr]

    asyncio.run(scenario())
    store.close()


def test_sqlite_and_postgres_rows_read_alike() -> None:
    row = Row((1, "a"), {"seq": 0, "role": 1})
    assert row[0] == 1 and row["role"] == "a" and dict(row) == {"seq": 1, "role": "a"}
    seq, role = row
    assert (seq, role) == (1, "a")


@pytest.mark.slow
def test_two_replicas_starting_together_migrate_once(postgres_dsn: str) -> None:
    from recallserve.serve.statedb import PostgresDatabase
    from tests._postgres import fresh_schema_dsn

    dsn = fresh_schema_dsn(postgres_dsn)
    barrier = threading.Barrier(4)
    errors: list[BaseException] = []

    def replica() -> None:
        db = PostgresDatabase(dsn, pool_size=2)
        try:
            barrier.wait()
            SessionStore(db=db), ExperienceStore(db=db), TraceStore(db=db)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            db.close()

    threads = [threading.Thread(target=replica) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    db = PostgresDatabase(dsn, pool_size=1)
    versions = db.run(lambda c: [tuple(r) for r in c.execute(
        "SELECT component, version FROM recallserve_schema ORDER BY component").fetchall()], write=False)
    assert versions == [("experiences", 1), ("sessions", 1), ("turns", 1)]
    db.close()


@pytest.mark.slow
def test_a_migration_waits_while_another_replica_holds_the_lock(postgres_dsn: str) -> None:
    import psycopg

    from recallserve.serve.statedb import PostgresDatabase
    from tests._postgres import fresh_schema_dsn

    dsn = fresh_schema_dsn(postgres_dsn)
    done = threading.Event()
    db = PostgresDatabase(dsn, pool_size=1)
    with psycopg.connect(dsn, autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK,))
        t = threading.Thread(target=lambda: (SessionStore(db=db), done.set()))
        t.start()
        assert not done.wait(1.0), "the migration ran while another replica held the lock"
        holder.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK,))
    assert done.wait(30.0)
    t.join()
    db.close()


@pytest.mark.slow
def test_concurrent_appends_on_two_pools_get_unique_seqs(postgres_dsn: str) -> None:
    """Two replicas (two pools) appending to one session: serializable writers, retried, no seq lost."""
    from recallserve.serve.statedb import PostgresDatabase
    from tests._postgres import fresh_schema_dsn

    dsn = fresh_schema_dsn(postgres_dsn)
    a, b = PostgresDatabase(dsn, pool_size=4), PostgresDatabase(dsn, pool_size=4)
    sa, sb = SessionStore(db=a), SessionStore(db=b)

    async def scenario() -> list[int]:
        session = await sa.open("acme", "u1", "s1")

        async def add(store: SessionStore, i: int) -> None:
            await store.append(session, [Message(role="user", content=f"m{i}")], [[]])

        await asyncio.gather(*(add(sa if i % 2 else sb, i) for i in range(24)))
        return [m.seq for m in await sb.messages("acme", "u1", "s1")]

    assert asyncio.run(scenario()) == list(range(24))

    async def many_sessions() -> int:
        # NOTE: 32 sessions of one user opened at once (the opens all read that user's memory):
        # serializable conflicts, retried, none refused.
        async def turn(i: int) -> None:
            store = sa if i % 2 else sb
            session = await store.open("acme", "u1", f"many-{i}")
            await store.append(session, [Message(role="user", content=f"hello {i}")], [[]])

        await asyncio.gather(*(turn(i) for i in range(32)))
        return sum([len(await sa.messages("acme", "u1", f"many-{i}")) for i in range(32)])

    assert asyncio.run(many_sessions()) == 32
    a.close(), b.close()


def test_an_unreachable_database_is_state_unavailable_not_a_hang() -> None:
    from recallserve.serve.statedb import PostgresDatabase

    start = time.monotonic()
    with pytest.raises(StateUnavailableError):
        PostgresDatabase("postgresql://nobody@127.0.0.1:1/none?connect_timeout=1", acquire_timeout_s=2.0)
    assert time.monotonic() - start < 20


def test_sqlite_database_rolls_back_a_failed_write(tmp_path: Path) -> None:
    db = SqliteDatabase(tmp_path / "x.sqlite3")
    db.run(lambda c: c.execute("CREATE TABLE t (v INTEGER)"), write=True)

    def fail(c: Any) -> None:
        c.execute("INSERT INTO t VALUES (1)")
        raise ValueError("boom")

    with pytest.raises(ValueError):
        db.run(fail, write=True)
    assert db.run(lambda c: c.execute("SELECT COUNT(*) FROM t").fetchone()[0], write=False) == 0
    db.close()


@pytest.mark.slow
def test_a_lost_database_is_a_503_with_retry_after_through_http(tmp_path: Path) -> None:
    """The database goes away under a running app: a session turn is a 503 in the API's envelope
    with Retry-After (nothing half-done), never a 500 or a hang."""
    import tempfile

    from fastapi.testclient import TestClient

    from recallserve.serve.statedb import PostgresDatabase
    from tests._postgres import postgres_server, stop_server
    from tests.unit.edge.conftest import assert_envelope, build_app, headers

    with postgres_server(Path(tempfile.mkdtemp(prefix="rs-pg-"))) as dsn:
        db = PostgresDatabase(dsn, pool_size=2, acquire_timeout_s=2.0)
        app, memory = build_app(tmp_path, db=db)
        body = {"model": "recallserve", "metadata": {"agent": "off", "session_id": "s1"},
                "messages": [{"role": "user", "content": "Where is order 104208?"}]}
        with TestClient(app, raise_server_exceptions=False) as c:
            assert c.post("/v1/chat/completions", json=body, headers=headers("acme")).status_code == 200
            stop_server(dsn)
            start = time.monotonic()
            r = c.post("/v1/chat/completions", json=body, headers=headers("acme"))
            assert time.monotonic() - start < 30
            error = assert_envelope(r, 503)
            assert error["code"] == "state_unavailable" and r.headers["retry-after"] == "1"
            assert "postgresql://" not in r.text
        for shard_client in memory.coordinator.shards:
            shard_client.shard.close()
        db.close()


def test_a_state_dsn_removes_the_state_replica_and_a_missing_one_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    from recallserve.deployments.app import deployment_names
    from recallserve.deployments.config import ConfigError, load_config

    assert "state" in deployment_names(load_config("cpu-local"))
    config = load_config("cpu-local", overrides={"state_db": {"dsn_env": "RS_TEST_STATE_DSN"}})
    assert "state" not in deployment_names(config) and "ingress" in deployment_names(config)
    monkeypatch.delenv("RS_TEST_STATE_DSN", raising=False)
    with pytest.raises(ConfigError, match="state_db.dsn_env: environment variable RS_TEST_STATE_DSN"):
        config.state_db.resolve()
    monkeypatch.setenv("RS_TEST_STATE_DSN", "postgresql://u@h/db")
    assert config.state_db.resolve() == "postgresql://u@h/db"
    with pytest.raises(ConfigError, match="state_db"):
        load_config("cpu-local", overrides={"state_db": {"dsn_env": "postgresql://u:pw@h/db"}})  # a DSN is not a name


@pytest.mark.slow
def test_an_ingress_replica_opens_its_stores_on_postgres(postgres_dsn: str) -> None:
    from recallserve.deployments.state import open_state_stores
    from recallserve.serve.traces import TraceConfig
    from tests._postgres import fresh_schema_dsn

    stores, db = open_state_stores(fresh_schema_dsn(postgres_dsn), TraceConfig(max_per_tenant=5), pool_size=2)

    async def scenario() -> None:
        session = await stores.sessions.open("acme", "u1", "s1")
        await stores.sessions.append(session, [Message(role="user", content="hello")], [[]])
        assert [m.content for m in await stores.sessions.messages("acme", "u1", "s1")] == ["hello"]
        assert await stores.turns.count("acme") == 0 and await stores.experiences.tenants() == []

    asyncio.run(scenario())
    assert stores.turns.config.max_per_tenant == 5
    db.close()


def test_the_experience_store_erases_and_exports_by_owner_on_each_backend(tmp_path: Path, state_db: Any) -> None:
    """The owner is read from the record's JSON by each backend's own expression (``Dialect.record_user``)."""
    store = ExperienceStore(tmp_path / "exp", db=state_db)
    emb = np.arange(4, dtype=np.float32)

    async def scenario() -> None:
        for exp_id, user in (("e1", "u1"), ("e2", "u2"), ("e3", None)):
            rec = speed_record(exp_id=exp_id, timestamp=time.time())
            if user is not None:
                rec["metadata"]["user"] = user
            await store.put("acme", ExperienceRecord.model_validate(rec), tier="active", family="qwen",
                            embedding=emb, last_used_at=time.time())
        assert [e["record"]["metadata"]["id"] for e in (await store.export_user("acme", "u2"))["experiences"]] == ["e2"]
        gone = await store.erase_user("acme", "u1")
        assert gone["experiences"] == 1 and gone["ids"] == ["e1"]
        assert await store.get("acme", "e1") is None
        assert await store.get("acme", "e2") is not None and await store.get("acme", "e3") is not None
        assert (await store.erase_user("acme", "u1"))["experiences"] == 0  # idempotent

    asyncio.run(scenario())
    store.close()
