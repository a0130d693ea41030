"""The zero-downtime re-embed on Ray Serve, end to end, while a writer never stops.

A small Ray runs the memory tier (MiniLM fp32, 2 shards) behind a probe deployment that builds
its memory service with the ingress's own ``memory_backend``. Then, with a writer adding,
deleting and searching the whole time:

1. the config with ``memory.migration`` (generation ``v2``, MiniLM int8, a new folder) is
   deployed: the new embedder and shards start beside the old ones, writes go to both;
2. ``reembed --live`` fills ``v2`` from the serving generation through the deployments;
3. reads move to ``v2`` (``migration.reads: target``), then writes (``writes: target``);
4. ``v2`` becomes the only generation (``memory.generation: v2``): the old shards go.

Each step is a Serve redeploy. Deployments are versioned by code and arguments
(``recallserve.deployments._versions``), so only the probe (the ingress) restarts, successor first
(``max_surge_percent``); shards and embedders keep their replicas.

Checked: no request failed, every acknowledged write is readable at the end with the new
model's vectors, deleted memories stay deleted, tenants stay apart, and the shard and embedder
replicas of both generations were never restarted.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import small_memory_ray

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
RAY_DIR = ROOT / ".recallserve" / "ray-test-reembed"
APP = "reembedtest"
TENANTS = ("acme", "globex", "initech")
INT8_ID = "sentence-transformers/all-MiniLM-L6-v2-int8-dynamic"


class MigrationProbe:
    """A minimal ingress: the ingress's ``memory_backend`` over the bound generations."""

    def __init__(self, generations: list[dict[str, Any]], memory: dict[str, Any]) -> None:
        from recallserve.deployments.config import MemoryConfig
        from recallserve.deployments.memory import memory_backend

        self.memory = MemoryConfig.model_validate(memory)
        self.backend = memory_backend(generations, self.memory)

    async def memory_routing(self) -> dict[str, Any]:
        m = self.memory.migration
        return {"generation": self.memory.generation, "migration": None if m is None else m.model_dump(mode="json")}

    async def add(self, tenant: str, text: str, source_id: str) -> str:
        from recallserve.serve.memory_api import MemoryIn

        (rid,) = await self.backend.add(tenant, [MemoryIn(text=text, source_id=source_id)])
        return rid

    async def delete(self, tenant: str, memory_id: str) -> None:
        await self.backend.delete(tenant, memory_id)

    async def get(self, tenant: str, memory_id: str) -> dict[str, Any] | None:
        from recallserve.serve.api.errors import APIError

        try:
            rec = await self.backend.get(tenant, memory_id)
        except APIError as exc:
            if exc.status == 404:
                return None
            raise
        return {"text": rec.text, "model": rec.embedding_model, "tenant": rec.tenant}

    async def search(self, tenant: str, query: str) -> list[str]:
        from recallserve.serve.memory_api import SearchRequest

        hits = await self.backend.search_request(tenant, SearchRequest(query=query, k=5, threshold=0.0))
        return [h.record.tenant for h in hits]


def _deploy(config: Any) -> None:
    from ray import serve

    from recallserve.deployments.memory import bind_memory

    _, generations = bind_memory(config)
    # NOTE: named "ingress": `reembed --live` asks the ingress which generations it writes.
    probe = serve.deployment(MigrationProbe, name="ingress", ray_actor_options={"num_cpus": 0.1},
                             graceful_shutdown_timeout_s=120, max_surge_percent=100)
    serve.run(probe.bind(generations, config.memory.model_dump(mode="json")), name=APP, route_prefix=None)


def _replicas(prefix: str) -> set[str]:
    import ray

    return {a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
            if a["name"].startswith("SERVE_REPLICA::") and f"#{prefix}" in a["name"]}


class Writer(threading.Thread):
    """Adds, deletes and searches through the probe until stopped; records acks and failures."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        from ray import serve

        self.handle = serve.get_app_handle(APP)
        self.stop = threading.Event()
        self.acked: dict[str, str] = {}
        self.deleted: dict[str, str] = {}
        self.errors: list[str] = []
        self.slowest = 0.0
        self.ops = 0
        self._rng = random.Random(11)

    def _call(self, method: str, *args: Any) -> Any:
        start = time.monotonic()
        try:
            return getattr(self.handle, method).remote(*args).result(timeout_s=120)
        except Exception as exc:  # noqa: BLE001 - any failure is what the test counts
            self.errors.append(f"{method}: {type(exc).__name__}: {str(exc)[:200]}")
            return None
        finally:
            self.slowest = max(self.slowest, time.monotonic() - start)
            self.ops += 1

    def run(self) -> None:
        n = 0
        while not self.stop.is_set():
            n += 1
            tenant = self._rng.choice(TENANTS)
            roll = self._rng.random()
            if roll < 0.6 or not self.acked:
                rid = self._call("add", tenant, f"{tenant} ticket {n}: unit {n % 13} fails with error E{n % 7}", f"w-{n}")
                if rid:
                    self.acked[rid] = tenant
            elif roll < 0.75:
                rid = self._rng.choice(sorted(self.acked))
                who = self.acked.pop(rid)
                self._call("delete", who, rid)
                self.deleted[rid] = who
            else:
                found = self._call("search", tenant, f"error E{n % 7}")
                if found is not None and not set(found) <= {tenant, "shared"}:
                    self.errors.append(f"search of {tenant} saw {set(found)}")
            time.sleep(0.05)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Path]]:
    root = tmp_path_factory.mktemp("reembed")
    with small_memory_ray(root / "v1", RAY_DIR) as config:
        _deploy(config)
        yield config, root


def test_reembed_without_downtime(cluster: tuple[Any, Path]) -> None:
    from ray import serve

    from recallserve.deployments.config import load_config
    from recallserve.deployments.jobs._options import JobOptions, LiveOptions
    from recallserve.deployments.jobs._reembed_live import run_live

    config, root = cluster
    handle = serve.get_app_handle(APP)
    before = {handle.add.remote(t, f"{t} archived ticket {i}: fan noise after firmware 2.{i}", f"a-{t}-{i}").result(): t
              for t in TENANTS for i in range(15)}
    writer = Writer()
    writer.start()
    data = config.model_dump(mode="json")
    migration = {"generation": "v2", "data_dir": str(root / "v2"),
                 "embedder": {**data["embedder"], "model": "all-MiniLM-L6-v2-int8"}}

    def phase(memory: dict[str, Any]) -> Any:
        cfg = load_config("cpu-local", overrides={**{k: v for k, v in data.items() if k != "memory"},
                                                  "memory": {**data["memory"], **memory}})
        started = time.monotonic()
        _deploy(cfg)
        print(f"deployed {sorted(memory)} in {time.monotonic() - started:.1f} s")
        return cfg

    try:
        kept_v1 = _replicas("memory_shard_") | _replicas("embedder")
        migrating = phase({"migration": migration})
        kept_v2 = _replicas("memory_shard_v2_") | _replicas("embedder_v2")
        assert len(kept_v2) == 3 and kept_v1 <= _replicas("memory_shard_") | _replicas("embedder")
        opts = JobOptions(data_dir=root / "v1", model_id="x", dim=384, batch_size=16, progress=False)
        report = run_live(opts, migrating, LiveOptions(app=APP, temp_dir=RAY_DIR))
        print("fill:", report.stats, f"{report.seconds:.1f} s")
        assert report.stats["inserted"] >= len(before) - len(writer.deleted)
        phase({"migration": {**migration, "reads": "target"}})
        phase({"migration": {**migration, "reads": "target", "writes": "target"}})
        assert kept_v1 <= _replicas("memory_shard_") | _replicas("embedder")
        phase({"generation": "v2", "data_dir": str(root / "v2"), "embedder": migration["embedder"], "migration": None})
        time.sleep(2)
    finally:
        writer.stop.set()
        writer.join(timeout=150)
    print(f"writer: {writer.ops} requests, slowest {writer.slowest:.1f} s, {len(writer.acked)} kept, {len(writer.deleted)} deleted")
    assert writer.errors == []
    assert writer.ops > 30
    # the final generation is v2 alone, on the replicas started for the migration
    assert _replicas("memory_shard_v2_") | _replicas("embedder_v2") == kept_v2
    assert not [n for n in _replicas("memory_shard_") if "memory_shard_v2_" not in n]
    kept = {rid: t for rid, t in {**before, **writer.acked}.items() if rid not in writer.deleted}
    for rid, tenant in kept.items():
        got = handle.get.remote(tenant, rid).result()
        assert got is not None, f"acknowledged memory {rid} of {tenant} is missing after the switch"
        assert got["model"] == INT8_ID and got["tenant"] == tenant
    for rid, tenant in writer.deleted.items():
        assert handle.get.remote(tenant, rid).result() is None, f"deleted memory {rid} came back"
    other = next(t for t in TENANTS if t != next(iter(kept.values())))
    assert handle.get.remote(other, next(iter(kept))).result() is None  # tenant isolation in v2
    assert set(handle.search.remote("acme", "fan noise after firmware").result()) <= {"acme", "shared"}


def test_live_reembed_refuses_a_cluster_not_writing_both(cluster: tuple[Any, Path]) -> None:
    from recallserve.deployments.config import load_config
    from recallserve.deployments.jobs._options import JobError, JobOptions, LiveOptions
    from recallserve.deployments.jobs._reembed_live import run_live

    config, root = cluster
    opts = JobOptions(data_dir=root / "v1", model_id="x", dim=384, progress=False)
    live = LiveOptions(app=APP, temp_dir=RAY_DIR)
    with pytest.raises(JobError, match="memory.migration: the config has no migration"):
        run_live(opts, config, live)
    data = config.model_dump(mode="json")
    step = {"generation": "v3", "data_dir": str(root / "v3"), "writes": "target", "reads": "target"}
    with pytest.raises(JobError, match="writes: both"):
        run_live(opts, load_config("cpu-local", overrides={**data, "memory": {**data["memory"], "migration": step}}), live)
    # The running app has the v3 deployments but writes to v3 alone: the job must not fill it.
    _deploy(load_config("cpu-local", overrides={**data, "memory": {**data["memory"], "migration": step}}))
    claimed = load_config("cpu-local", overrides={**data, "memory": {**data["memory"], "migration": {**step, "writes": "both"}}})
    with pytest.raises(JobError, match="is not writing to both generations for 'v3'"):
        run_live(opts, claimed, live)

