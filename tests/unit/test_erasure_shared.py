"""One erasure log for every ingress replica, on both state backends (SQLite: the ``state``
deployment's one file; PostgreSQL: the table every replica reaches through its own pool).

Two "replicas" here are two :class:`ErasureService` instances, each with its own log connection
(its own PostgreSQL pool) and its own app of the real erasure routes, sharing the memory shards and
the state stores as replicas share them through handles. Over HTTP: an erasure asked of one
replica is read (pending, then done) on the other; a run whose replica died is taken over once,
by one replica, after its lease; an admin key erases a whole tenant live (every store), a tenant
key gets a 403.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from recallserve.memory_shards import HashingEmbedder
from recallserve.memory_shards.retrieval import local_hybrid_coordinator
from recallserve.serve.api.auth import Authenticator
from recallserve.serve.api.errors import install_error_handlers
from recallserve.serve.context import SessionStore
from recallserve.serve.context._types import Message
from recallserve.serve.erasure import ErasureLog, ErasureService, OwnedStore, build_router, user_hash
from recallserve.serve.experience import ExperienceStore
from recallserve.serve.memory_api import MemoryService
from recallserve.serve.memory_api.schemas import MemoryIn
from recallserve.serve.statedb import PostgresDatabase
from recallserve.serve.traces import TraceStore
from recallserve.serve.traces._models import TurnTrace
from tests.conftest import STATE_BACKENDS

KEYS = {"sk-acme": "acme", "sk-globex": "globex", "sk-ops": "ops"}
A, G, OPS = ({"Authorization": f"Bearer {k}"} for k in ("sk-acme", "sk-globex", "sk-ops"))
EMB = HashingEmbedder(64)


async def _embed(texts: list[str]) -> Any:
    return EMB.embed(texts)


@pytest.fixture(params=STATE_BACKENDS)
def logs(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[ErasureLog, ErasureLog, ErasureLog, Any]]:
    """Three connections to one log (three replicas) and the stores' database (None: SQLite files)."""
    if request.param == "sqlite":
        path = tmp_path / "state" / "erasures.sqlite3"
        opened = [ErasureLog(path) for _ in range(3)]
        yield opened[0], opened[1], opened[2], None
        for log in opened:
            log.close()
        return
    from tests._postgres import fresh_schema_dsn

    dsn = fresh_schema_dsn(request.getfixturevalue("postgres_dsn"))
    dbs = [PostgresDatabase(dsn, pool_size=3) for _ in range(3)]
    yield ErasureLog(db=dbs[0]), ErasureLog(db=dbs[1]), ErasureLog(db=dbs[2]), dbs[0]
    for db in dbs:
        db.close()


class Cluster:
    """The shared memory shards and state stores, and one erasure service + app per replica."""

    def __init__(self, root: Path, logs: tuple[ErasureLog, ...], db: Any) -> None:
        self.coord = local_hybrid_coordinator(2, EMB.model_id, EMB.dim, data_root=root / "memory")
        self.memory = MemoryService(self.coord, _embed, threshold=0.0)
        self.sessions = SessionStore(root / "sessions.sqlite3", db=db)
        self.traces = TraceStore(root / "turns.sqlite3", db=db)
        self.experiences = ExperienceStore(root / "exp", db=db)
        stores: dict[str, OwnedStore] = {"sessions": self.sessions, "turns": self.traces,
                                         "experiences": self.experiences}
        self.auth = Authenticator(KEYS, admins=["ops"])
        self.services = [ErasureService(log, self.memory.coordinators(), stores, retry_s=0.1, lease_s=5.0)
                         for log in logs]
        self.apps = []
        for service in self.services:
            app = FastAPI()
            install_error_handlers(app)
            app.include_router(build_router(service, self.auth))
            self.apps.append(app)

    def client(self, i: int) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.ASGITransport(app=self.apps[i]), base_url="http://replica")

    async def plant(self, tenant: str, user: str, tag: str) -> None:
        await self.memory.add(tenant, [MemoryIn(text=f"{tag} likes the pier", user=user)])
        session = await self.sessions.open(tenant, user, f"s-{tag}")
        await self.sessions.append(session, [Message(id=f"m-{tag}", seq=-1, role="user", content=f"I am {tag}",
                                                     timestamp=1.0, category="fact", retention=2, tokens=3)], [[]])
        await self.traces.put(tenant, TurnTrace(id=f"t-{tag}", created_at=time.time(), user=user, question=f"{tag}?",
                                                answer=f"{tag}!", path="plain", finish_reason="stop"))

    async def holds(self, tenant: str, user: str) -> dict[str, int]:
        """What the stores still hold for ``user`` (memories, sessions, turns)."""
        return {"memories": len(await self.coord.owned(tenant, user)),
                "sessions": len((await self.sessions.export_user(tenant, user))["sessions"]),
                "turns": len((await self.traces.export_user(tenant, user))["turns"])}

    def close(self) -> None:
        for c in self.coord.shards:
            c.shard.close()
        for store in (self.sessions, self.traces, self.experiences):
            store.close()


async def _done(client: httpx.AsyncClient, eid: str, headers: dict[str, str]) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while (row := (await client.get(f"/v1/erasures/{eid}", headers=headers)).json())["status"] != "done":
        assert time.monotonic() < deadline, row
        await asyncio.sleep(0.05)
    return row


def test_an_erasure_asked_of_one_replica_is_read_on_another(logs: Any, tmp_path: Path) -> None:
    async def run() -> None:
        cluster = Cluster(tmp_path, logs[:3], logs[3])
        try:
            await cluster.plant("acme", "ann", "zqann")
            await cluster.plant("acme", "bob", "zqbob")
            async with cluster.client(0) as one, cluster.client(1) as two:
                r = await one.delete("/v1/users/ann", headers=A)
                assert r.status_code == 202, r.text
                eid = r.json()["id"]
                # NOTE: the other replica answers at once (pending or done), never a 404.
                seen = await two.get(f"/v1/erasures/{eid}", headers=A)
                assert seen.status_code == 200 and seen.json()["status"] in ("pending", "done"), seen.text
                again = await two.delete("/v1/users/ann", headers=A)  # idempotent across replicas
                assert again.status_code == 202
                row = await _done(two, eid, A)
                assert row["counts"]["memories"] == 1 and row["counts"]["sessions"] == 1 and row["counts"]["turns"] == 1
                listed = (await two.get("/v1/erasures", headers=A)).json()["data"]
                assert eid in [x["id"] for x in listed] and "ann" not in str(listed)
                assert (await two.get(f"/v1/erasures/{eid}", headers=G)).status_code == 404
            assert await cluster.holds("acme", "ann") == {"memories": 0, "sessions": 0, "turns": 0}
            assert await cluster.holds("acme", "bob") == {"memories": 1, "sessions": 1, "turns": 1}
        finally:
            cluster.close()

    asyncio.run(run())


def test_a_dead_replicas_erasure_is_taken_over_once_after_its_lease(logs: Any, tmp_path: Path) -> None:
    async def run() -> None:
        cluster = Cluster(tmp_path, logs[:3], logs[3])
        try:
            await cluster.plant("acme", "ann", "zqann")
            log = logs[0]
            # NOTE: replica 0 logged the erasure and started its run, then died (its lease runs 0.5 s).
            row, created = await log.begin("acme", "ann", user_hash("acme", "ann"), "key_x")
            assert created and await log.claim(row.id, "run_dead", 0.5)
            _, two, three = cluster.services
            assert await asyncio.gather(two.resume(), three.resume()) == [0, 0]  # the lease still holds
            await asyncio.sleep(0.6)
            took = await asyncio.gather(two.resume(), three.resume())
            assert sorted(took) == [0, 1], took  # exactly one replica takes it over
            runner = two if took[0] else three
            await runner.wait(row.id)
            done = await logs[2].get("acme", row.id)
            # NOTE: two runs in all: the dead one's and the one take-over.
            assert done is not None and done.status == "done" and done.attempts == 2, done
            assert await cluster.holds("acme", "ann") == {"memories": 0, "sessions": 0, "turns": 0}
            assert await asyncio.gather(two.resume(), three.resume()) == [0, 0]  # done: nothing to take
        finally:
            cluster.close()

    asyncio.run(run())


def test_an_admin_key_erases_a_whole_tenant_live_and_a_tenant_key_gets_403(logs: Any, tmp_path: Path) -> None:
    async def run() -> None:
        cluster = Cluster(tmp_path, logs[:3], logs[3])
        try:
            for user in ("ann", "bob"):
                await cluster.plant("acme", user, f"zq{user}")
                await cluster.plant("globex", user, f"zqg{user}")
            await cluster.memory.add("acme", [MemoryIn(text="zq tenant handbook")])  # no owner: the tenant's
            async with cluster.client(0) as one, cluster.client(1) as two:
                refused = await one.delete("/v1/tenants/globex", headers=A)
                assert refused.status_code == 403 and refused.json()["error"]["code"] == "admin_required", refused.text
                own = await one.delete("/v1/tenants/acme", headers=A)  # not even its own tenant
                assert own.status_code == 403
                for bad in ("shared", "__warm_up__"):
                    r = await one.delete(f"/v1/tenants/{bad}", headers=OPS)
                    assert r.status_code == 400 and r.json()["error"]["param"] == "tenant", r.text
                r = await one.delete("/v1/tenants/acme", headers=OPS)
                assert r.status_code == 202 and r.headers["location"] == f"/v1/erasures/{r.json()['id']}", r.text
                assert r.json()["tenant"] == "acme" and r.json()["requester"].startswith("key_")
                row = await _done(two, r.json()["id"], OPS)  # the admin reads it on any replica
                assert row["counts"]["memories"] == 3 and row["counts"]["sessions"] == 2 and row["counts"]["turns"] == 2
                # NOTE: acme's own keys see the row of their tenant's erasure; another tenant does not.
                assert (await two.get(f"/v1/erasures/{row['id']}", headers=A)).status_code == 200
                assert (await two.get(f"/v1/erasures/{row['id']}", headers=G)).status_code == 404
            for user in ("ann", "bob"):
                assert await cluster.holds("acme", user) == {"memories": 0, "sessions": 0, "turns": 0}
                assert await cluster.holds("globex", user) == {"memories": 1, "sessions": 1, "turns": 1}
            assert await cluster.coord.owned("acme", None) == []
        finally:
            cluster.close()

    asyncio.run(run())
