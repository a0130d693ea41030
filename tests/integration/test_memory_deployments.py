"""The memory tier on Ray Serve: embedder (dynamic batching) + 2 shard deployments behind the
handle-backed memory service; a shard replica killed mid-writes and a full redeploy lose no
acknowledged write.

Starts its own small Ray (2 logical CPUs, fractional deployments) and shuts it down.
"""

from __future__ import annotations

import os
import signal
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
        from recallserve.deployments.config import MemoryConfig
        from recallserve.deployments.memory import HandleMemoryBackend

        self.backend = HandleMemoryBackend(embedder, shards, MemoryConfig.model_validate(memory))

    async def add(self, tenant: str, texts: list[str]) -> list[str]:
        from recallserve.serve.memory_api import MemoryIn

        return await self.backend.add(tenant, [MemoryIn(text=t, source_id=t) for t in texts])

    async def get(self, tenant: str, memory_id: str) -> str | None:
        from recallserve.serve.api.errors import APIError

        try:
            return (await self.backend.get(tenant, memory_id)).text
        except APIError:
            return None

    async def search(self, tenant: str, query: str, k: int) -> list[str]:
        from recallserve.serve.memory_api import SearchRequest

        return [h.record.text for h in await self.backend.search_request(tenant, SearchRequest(query=query, k=k, threshold=0.0))]

    async def shard_of(self, tenant: str) -> int:
        return self.backend.coordinator.shard_of_tenant(tenant)

    async def outcomes(self, tenant: str, memory_id: str, text: str) -> list[str]:
        """A get by id and a search of ``tenant``: "ok", "503", or what else went wrong."""
        from recallserve.serve.memory_api import MemoryUnavailable, SearchRequest

        out = []
        for read in (self.backend.get(tenant, memory_id),
                     self.backend.search_request(tenant, SearchRequest(query=text, k=3, threshold=0.0))):
            try:
                got = await read
                ok = got.text == text if hasattr(got, "text") else text in [h.record.text for h in got]
                out.append("ok" if ok else "wrong")
            except MemoryUnavailable:
                out.append("503")
            except Exception as exc:  # noqa: BLE001 - counted, not raised: the test reports every kind
                out.append(type(exc).__name__)
        return out


def _deploy(config: Any) -> Any:
    from ray import serve

    from recallserve.deployments.memory import bind_memory

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


def _replica_pids(deployment: str) -> dict[str, int]:
    """PIDs of the deployment's replica actors, from Ray's actor table (no dashboard needed)."""
    import ray

    names = {a["name"] for a in _replicas(deployment)}
    table = ray._private.state.actors()
    return {info["Name"]: int(info["Pid"]) for info in table.values()
            if info.get("Name") in names and info.get("State") == "ALIVE" and info.get("Pid")}


def test_a_shard_kill_fails_no_read_of_a_tenant_on_the_other_shard(cluster: Any) -> None:
    handle = _deploy(cluster)
    by_shard: dict[int, str] = {}
    for i in range(40):
        by_shard.setdefault(handle.shard_of.remote(f"tenant-{i}").result(), f"tenant-{i}")
    dead_t, live_t = by_shard[0], by_shard[1]
    texts = {t: [f"{t} remembers fact {j} about kites" for j in range(8)] for t in (dead_t, live_t)}
    ids = {t: handle.add.remote(t, texts[t]).result() for t in texts}
    for t in texts:  # the ingress hears from both shards (neither holds shared rows)
        assert handle.outcomes.remote(t, ids[t][0], texts[t][0]).result() == ["ok", "ok"]

    counts: dict[str, dict[str, int]] = {live_t: {}, dead_t: {}}
    stop = threading.Event()

    def reader(tenant: str) -> None:
        j = 0
        while not stop.is_set():
            k = j % len(ids[tenant])
            try:
                got = handle.outcomes.remote(tenant, ids[tenant][k], texts[tenant][k]).result(timeout_s=30)
            except Exception as exc:  # noqa: BLE001 - the probe itself failing counts as failed reads
                got = [type(exc).__name__] * 2
            for o in got:
                counts[tenant][o] = counts[tenant].get(o, 0) + 1
            j += 1
            time.sleep(0.02)

    threads = [threading.Thread(target=reader, args=(t,), daemon=True) for t in (live_t, dead_t)]
    for t in threads:
        t.start()
    time.sleep(1.5)
    pids = _replica_pids("memory_shard_0")
    assert pids, "no live replica of memory_shard_0"
    killed_at = time.monotonic()
    for pid in pids.values():
        os.kill(pid, signal.SIGKILL)  # NOTE: only the shard replica this test's cluster started
    recovered = None
    while time.monotonic() - killed_at < 90:
        before = counts[dead_t].get("ok", 0)
        time.sleep(0.5)
        if set(_replica_pids("memory_shard_0").values()) - set(pids.values()) and counts[dead_t].get("ok", 0) > before:
            recovered = time.monotonic() - killed_at
            break
    time.sleep(1.0)
    stop.set()
    for t in threads:
        t.join(timeout=60)
    live_failed = sum(n for o, n in counts[live_t].items() if o != "ok")
    print(f"\nshard 0 kill -9: other tenant {counts[live_t]}, own tenant {counts[dead_t]}, "
          f"recovered after {recovered and round(recovered, 1)} s")
    assert recovered is not None, f"shard 0 did not come back: {counts[dead_t]}"
    assert counts[live_t].get("ok", 0) > 20 and live_failed == 0, f"reads of {live_t} failed: {counts[live_t]}"
    assert set(counts[dead_t]) <= {"ok", "503"}, f"the shard's own tenant saw more than 503s: {counts[dead_t]}"
