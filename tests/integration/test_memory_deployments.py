"""The memory tier on Ray Serve: embedder (dynamic batching) + 2 shard deployments behind the
handle-backed memory service; a shard replica killed mid-writes and a full redeploy lose no
acknowledged write.

Starts its own small Ray (2 logical CPUs, fractional deployments) and shuts it down.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import small_memory_ray

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
RAY_DIR = ROOT / ".recallserve" / "ray-test-memory"
APP = "memtest"


class MemoryProbe:
    """A minimal ingress for the test: the real ``HandleMemoryBackend`` over the handles."""

    def __init__(self, embedder: Any, shards: list[Any], memory: dict[str, Any]) -> None:
        from deployments.config import MemoryConfig
        from deployments.memory import HandleMemoryBackend

        self.backend = HandleMemoryBackend(embedder, shards, MemoryConfig.model_validate(memory))

    async def add(self, tenant: str, texts: list[str]) -> list[str]:
        from serve.memory_api import MemoryIn

        return await self.backend.add(tenant, [MemoryIn(text=t, source_id=t) for t in texts])

    async def get(self, tenant: str, memory_id: str) -> str | None:
        from serve.api.errors import APIError

        try:
            return (await self.backend.get(tenant, memory_id)).text
        except APIError:
            return None

    async def search(self, tenant: str, query: str, k: int) -> list[str]:
        from serve.memory_api import SearchRequest

        return [h.record.text for h in await self.backend.search_request(tenant, SearchRequest(query=query, k=k, threshold=0.0))]

    async def shard_of(self, tenant: str) -> int:
        return self.backend.coordinator.shard_of_tenant(tenant)


def _deploy(config: Any) -> Any:
    from ray import serve

    from deployments.memory import bind_memory

    _, (generation,) = bind_memory(config)
    embedder, shards = generation["embedder"], generation["shards"]
    probe = serve.deployment(MemoryProbe, name="probe", ray_actor_options={"num_cpus": 0.1})
    return serve.run(probe.bind(embedder, shards, config.memory.model_dump(mode="json")), name=APP, route_prefix=None)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with small_memory_ray(tmp_path_factory.mktemp("memory"), RAY_DIR) as config:
        yield config


def _replicas(deployment: str) -> list[dict[str, str]]:
    import ray

    return [a for a in ray.util.list_named_actors(all_namespaces=True)
            if a["name"].startswith("SERVE_REPLICA::") and f"#{deployment}#" in a["name"]]


def _kill_replica(deployment: str) -> set[str]:
    """SIGKILL-equivalent of the deployment's replica actors; returns their names."""
    import ray

    found = _replicas(deployment)
    assert found, f"no replica actor of {deployment}"
    for a in found:
        ray.kill(ray.get_actor(a["name"], namespace=a["namespace"]), no_restart=True)
    return {a["name"] for a in found}


def test_acknowledged_writes_survive_replica_kill_and_redeploy(cluster: Any) -> None:
    from ray import serve

    handle = _deploy(cluster)
    tenant = "acme"
    shard = handle.shard_of.remote(tenant).result()
    first = handle.add.remote(tenant, [f"acme fact {i} about llamas" for i in range(20)]).result()
    assert len(first) == 20
    assert handle.search.remote(tenant, "acme fact 7 about llamas", 3).result()[0] == "acme fact 7 about llamas"
    assert handle.search.remote("globex", "acme fact 7 about llamas", 3).result() == []

    acked: dict[str, str] = {rid: f"acme fact {i} about llamas" for i, rid in enumerate(first)}
    failures: list[str] = []
    stop = threading.Event()

    def writer() -> None:
        i = 100
        while not stop.is_set():
            text = f"acme note {i}"
            try:
                ids = handle.add.remote(tenant, [text]).result(timeout_s=60)
                acked[ids[0]] = text
            except Exception as exc:  # noqa: BLE001 - a write refused while the shard restarts is fine
                failures.append(type(exc).__name__)
                time.sleep(0.2)
            i += 1

    t = threading.Thread(target=writer, daemon=True)
    t.start()
    time.sleep(2.0)
    before_kill = len(acked)
    killed = _kill_replica(f"memory_shard_{shard}")
    deadline = time.monotonic() + 120
    while len(acked) < before_kill + 5 and time.monotonic() < deadline:
        time.sleep(0.5)
    stop.set()
    t.join(timeout=90)
    assert len(acked) >= before_kill + 5, f"writes did not resume after the shard restart ({failures[-3:]})"
    replaced = {a["name"] for a in _replicas(f"memory_shard_{shard}")}
    assert replaced and not (replaced & killed), "the killed shard replica was not replaced by a new one"

    for rid, text in acked.items():
        assert handle.get.remote(tenant, rid).result() == text, f"acknowledged write {rid} lost after the kill"

    # A full teardown and redeploy of the app reads everything back from the shards' folders.
    serve.delete(APP)
    handle = _deploy(cluster)
    missing = [rid for rid, text in acked.items() if handle.get.remote(tenant, rid).result() != text]
    assert not missing, f"{len(missing)} acknowledged writes lost after redeploy"
    assert handle.search.remote(tenant, "acme fact 7 about llamas", 3).result()[0] == "acme fact 7 about llamas"
    print(f"\n{len(acked)} acknowledged writes kept ({len(failures)} refused while the shard restarted)")
