"""The zero-downtime re-embed, in process: dual writes (``MigratingMemoryService``) plus the
live job's fill and prune passes (``_reembed_live``) over real hybrid shards on disk.

Two hashing embedders of different dimensions stand in for the old and the new model (each is
a real embedder with its own model id; a shard refuses the other's vectors).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from recallserve.deployments.jobs._reembed_live import fill_batch, prune_batch
from recallserve.memory_shards.shard_access import HybridShardAccess
from recallserve.memory_shards.records import content_key
from recallserve.memory_shards import EmbeddedRecord, HashingEmbedder
from recallserve.memory_shards.retrieval import local_hybrid_coordinator
from recallserve.serve.api.errors import APIError
from recallserve.serve.memory_api import MemoryIn, MemoryService, MigratingMemoryService, SearchRequest

OLD, NEW = HashingEmbedder(384), HashingEmbedder(256)


def _service(root: Path, emb: HashingEmbedder) -> MemoryService:
    coord = local_hybrid_coordinator(2, emb.model_id, emb.dim, data_root=root)

    async def embed(texts: list[str]):
        return await asyncio.to_thread(emb.embed, texts)

    return MemoryService(coord, embed, top_k=16, threshold=0.0)


@pytest.fixture
def gens(tmp_path: Path) -> Iterator[tuple[MemoryService, MemoryService]]:
    current, target = _service(tmp_path / "v1", OLD), _service(tmp_path / "v2", NEW)
    yield current, target
    for svc in (current, target):
        for client in svc.coordinator.shards:
            client.shard.close()


def _access(svc: MemoryService, i: int) -> HybridShardAccess:
    return HybridShardAccess(svc.coordinator.shards[i].shard)


def _fill_and_prune(current: MemoryService, target: MemoryService, batch: int = 7) -> dict[str, int]:
    totals: dict[str, int] = {}
    for i in range(2):
        src, dst = _access(current, i), _access(target, i)
        for walker, fn in ((src, lambda b: fill_batch(src, dst, NEW.embed, NEW.model_id, NEW.dim, b, False)),
                           (dst, lambda b: prune_batch(src, dst, b, False))):
            after = None
            while page := walker.page(after, batch):
                for key, value in fn(page).items():
                    totals[key] = totals.get(key, 0) + value
                after = page[-1].record.id
    return totals


def _contents(svc: MemoryService) -> dict[str, str]:
    return {r.id: content_key(r) for c in svc.coordinator.shards for r in c.shard.shard.records()}


def _models(svc: MemoryService) -> set[str]:
    return {r.embedding_model for c in svc.coordinator.shards for r in c.shard.shard.records()}


async def _add(svc: MemoryService, tenant: str, text: str, source: str | None = None) -> str:
    (rid,) = await svc.add(tenant, [MemoryIn(text=text, source_id=source)])
    return rid


def test_dual_writes_then_fill_makes_the_new_generation_equal(gens: tuple[MemoryService, MemoryService]) -> None:
    current, target = gens

    async def scenario() -> None:
        old = [await _add(current, t, f"{t} ticket {i}: printer error E{i} fixed by fuser swap", f"{t}-src-{i}")
               for t in ("acme", "globex") for i in range(12)]
        await _add(current, "shared", "manual: error E42 means the thermal fuse TF-185 has blown", "manual-e42")
        svc = MigratingMemoryService(current, target, reads="current")
        new = await _add(svc, "acme", "dual-written: fan rattles after firmware 2.1", "acme-new")
        await svc.delete("acme", old[0])  # only in the serving generation so far: the 404 there is ignored
        replaced = await _add(svc, "acme", "acme ticket 1 reopened: fuser swap did not help", "acme-src-1")
        assert new in _contents(target) and replaced in _contents(target) and len(_contents(target)) == 2
        stats = _fill_and_prune(current, target)
        assert stats["inserted"] == 2 * 12 + 1 - 2 and stats["unchanged"] == 2
        assert _contents(target) == _contents(current) and _models(target) == {NEW.model_id}
        assert old[0] not in _contents(target) and old[1] not in _contents(target)  # deleted / replaced by source

        reads = MigratingMemoryService(current, target, reads="target")
        hits = await reads.search_request("acme", SearchRequest(query="fan rattles firmware", k=3))
        assert hits[0].record.id == new
        seen = {h.record.tenant for h in await reads.search_request("globex", SearchRequest(query="printer error", k=40))}
        assert seen <= {"globex", "shared"} and "globex" in seen  # tenant isolation holds in the new generation
        with pytest.raises(APIError) as err:
            await reads.get("globex", new)
        assert err.value.status == 404
        # A second run finds nothing to do.
        again = _fill_and_prune(current, target)
        assert again.get("inserted", 0) == again.get("updated", 0) == again.get("pruned", 0) == 0

    asyncio.run(scenario())


class _RacingTarget(HybridShardAccess):
    """The new generation's shard, where a user's change lands between the job's reads and its insert."""

    def __init__(self, inner: HybridShardAccess, before_insert) -> None:  # type: ignore[no-untyped-def]
        super().__init__(inner.hybrid)
        self._before_insert = before_insert

    def insert_absent(self, items: Sequence[EmbeddedRecord]) -> list[str]:
        self._before_insert()
        return super().insert_absent(items)


@pytest.mark.parametrize("race", ["delete", "replace"])
def test_a_change_racing_the_fill_wins(gens: tuple[MemoryService, MemoryService], race: str) -> None:
    current, target = gens
    svc = MigratingMemoryService(current, target)

    async def setup() -> str:
        return await _add(current, "acme", "printer error E7: swap the fuser", "t-7")

    rid = asyncio.run(setup())
    shard = current.coordinator.shard_of_tenant("acme")
    src = _access(current, shard)

    def user_change() -> None:
        # NOTE: runs in the job's thread, as a request would run concurrently: the serving
        # generation first, then the new one, exactly as MigratingMemoryService orders them.
        if race == "delete":
            asyncio.run(svc.delete("acme", rid))
        else:
            asyncio.run(_add(svc, "acme", "printer error E7 again: board replaced", "t-7"))

    dst = _RacingTarget(_access(target, shard), user_change)
    stats = fill_batch(src, dst, NEW.embed, NEW.model_id, NEW.dim, src.page(None, 10), False)
    assert rid not in _contents(target)
    assert _contents(target) == _contents(current)
    if race == "delete":
        assert stats["inserted"] == 1 and stats["undone"] == 1  # inserted after the user's delete, then undone
    else:
        assert stats["skipped_newer"] == 1  # the user's replacement (same source) was already there


def test_fill_under_concurrent_writes_loses_nothing(gens: tuple[MemoryService, MemoryService]) -> None:
    current, target = gens
    rng = random.Random(7)

    async def scenario() -> None:
        for i in range(60):
            await _add(current, rng.choice(["acme", "globex"]), f"old memory {i} about part P-{i % 9}", f"s-{i}")
        svc = MigratingMemoryService(current, target)
        acked: dict[str, str] = {}
        deleted: set[str] = set()
        job = asyncio.create_task(asyncio.to_thread(_fill_and_prune, current, target, 5))
        n = 0
        while not job.done() or n < 40:
            n += 1
            tenant = rng.choice(["acme", "globex"])
            op = rng.random()
            if op < 0.5:
                acked[await _add(svc, tenant, f"new memory {n}", f"n-{n}")] = tenant
            elif op < 0.75:
                acked[await _add(svc, tenant, f"rewrite of s-{n % 60}", f"s-{n % 60}")] = tenant
            else:
                victims = [r.id for c in current.coordinator.shards for r in c.shard.shard.records() if r.tenant == tenant]
                if victims:
                    victim = rng.choice(victims)
                    await svc.delete(tenant, victim)
                    deleted.add(victim)
            await asyncio.sleep(0)
        await job
        # NOTE: one more fill after the writers stopped must find nothing left to copy.
        final = await asyncio.to_thread(_fill_and_prune, current, target, 5)
        assert final.get("inserted", 0) == final.get("updated", 0) == final.get("pruned", 0) == 0, final
        held = _contents(target)
        assert held == _contents(current)
        live = {rid for rid in acked if rid not in deleted} & set(_contents(current))
        assert live and live <= set(held)
        assert not deleted & set(held)

    asyncio.run(scenario())


def test_a_write_in_flight_between_the_generations_survives_the_prune(gens: tuple[MemoryService, MemoryService]) -> None:
    """The job runs while a write has reached one generation but not yet the other."""
    current, target = gens

    def prune_now() -> None:
        for i in range(2):
            src, dst = _access(current, i), _access(target, i)
            page = dst.page(None, 100)
            if page:
                prune_batch(src, dst, page, False)

    class Paused(MemoryService):
        async def add_records(self, records):  # type: ignore[no-untyped-def]
            await asyncio.to_thread(prune_now)  # the job's pass lands mid-write
            return await super().add_records(records)

    paused = Paused(current.coordinator, current.embed, top_k=16, threshold=0.0)
    svc = MigratingMemoryService(paused, target)
    rid = asyncio.run(_add(svc, "acme", "fan rattles after firmware 2.1", "fan-1"))
    assert rid in _contents(target) and _contents(target) == _contents(current)


def test_fill_compares_against_a_fresh_read_of_the_serving_generation(gens: tuple[MemoryService, MemoryService]) -> None:
    """A same-id rewrite that lands after the job read its page must not be undone by the page's copy."""
    current, target = gens
    rid = asyncio.run(_add(current, "acme", "printer error E9: reseat the drum", "e9"))
    svc = MigratingMemoryService(current, target)
    shard = current.coordinator.shard_of_tenant("acme")
    src = _access(current, shard)
    page = src.page(None, 10)  # the job's page holds the first text
    rec = page[0].record.model_copy(update={"text": "printer error E9: drum replaced", "embedding_model": ""})
    asyncio.run(svc.add_records([rec]))  # the same id rewritten in both generations
    fill_batch(src, _access(target, shard), NEW.embed, NEW.model_id, NEW.dim, page, False)
    (held,) = [r for c in target.coordinator.shards for r in c.shard.shard.records() if r.id == rid]
    assert held.text == "printer error E9: drum replaced"


def test_writes_to_the_target_alone_leave_the_old_generation_idle(gens: tuple[MemoryService, MemoryService]) -> None:
    current, target = gens
    with pytest.raises(ValueError, match="writes"):
        MigratingMemoryService(current, target, reads="current", writes="target")
    svc = MigratingMemoryService(current, target, reads="target", writes="target")
    rid = asyncio.run(_add(svc, "acme", "only in the new generation", "only-new"))
    assert rid in _contents(target) and not _contents(current)
    asyncio.run(svc.delete("acme", rid))
    assert not _contents(target)


@pytest.mark.parametrize(("argv", "message"), [
    (["--live", "--embedder", "minilm"], "--embedder: not used with --live"),
    (["--target", "/tmp/x"], "--embedder: required without --live"),
    (["--embedder", "bogus", "--target", "/tmp/x"], "embedder: expected 'minilm', 'minilm-int8'"),
])
def test_reembed_flags_are_checked(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    from recallserve.deployments.jobs import reembed

    assert reembed.main(["--no-progress", *argv]) == 2
    assert message in capsys.readouterr().err


def test_a_write_failing_on_the_target_is_not_acknowledged_and_is_counted(gens: tuple[MemoryService, MemoryService]) -> None:
    from recallserve.serve.api.metrics import MEMORY_MIGRATION_WRITES

    current, target = gens

    class Down(MemoryService):
        async def add_records(self, records):  # type: ignore[no-untyped-def]
            raise APIError(503, "memory shard 0 unavailable", type="service_unavailable")

    svc = MigratingMemoryService(current, Down(target.coordinator, target.embed), target_name="vtest")
    failed = MEMORY_MIGRATION_WRITES.labels("vtest", "failed")
    before = failed._value.get()
    with pytest.raises(APIError) as err:
        asyncio.run(_add(svc, "acme", "written while the new generation is down", "down-1"))
    assert err.value.status == 503 and failed._value.get() == before + 1
    # The old generation holds it (the caller got a 503 and retries); the next fill copies it over.
    assert len(_contents(current)) == 1 and not _contents(target)
    _fill_and_prune(current, target)
    assert _contents(target) == _contents(current)
