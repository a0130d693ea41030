"""Live maintenance jobs on Ray Serve: ``expiry-sweep --live`` and ``consolidate --live`` work
through the running memory shard deployments while a writer keeps adding memories; expired
memories go, duplicates merge, and every acknowledged write stays readable.

Starts its own small Ray (2 logical CPUs, fractional deployments, as
``test_memory_deployments``) and shuts it down.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import small_memory_ray

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
RAY_DIR = ROOT / ".recallserve" / "ray-test-live"
APP = "livetest"
TENANTS = ("acme", "globex", "initech", "umbrella")
# NOTE: random 8-word bags from this vocabulary are far below the 0.95 cosine that merges.
WORDS = ("amber basalt cactus dynamo ember falcon glacier harbor iris jasmine kettle lantern meadow nebula "
         "orchid pylon quartz raven saffron tundra umber violet walnut xylophone yarrow zephyr anchor bramble "
         "cobalt drizzle").split()


class LiveProbe:
    """A minimal ingress for the test: the real ``HandleMemoryBackend`` over the handles."""

    def __init__(self, embedder: Any, shards: list[Any], memory: dict[str, Any]) -> None:
        from recallserve.deployments.config import MemoryConfig
        from recallserve.deployments.memory import HandleMemoryBackend

        self.backend = HandleMemoryBackend(embedder, shards, MemoryConfig.model_validate(memory))

    async def add(self, tenant: str, items: list[dict[str, Any]]) -> list[str]:
        from recallserve.serve.memory_api import MemoryIn

        return await self.backend.add(tenant, [MemoryIn.model_validate(i) for i in items])

    async def get(self, tenant: str, memory_id: str) -> dict[str, Any] | None:
        from recallserve.serve.api.errors import APIError

        try:
            rec = await self.backend.get(tenant, memory_id)
        except APIError:
            return None
        return {"text": rec.text, "metadata": dict(rec.metadata)}

    async def shard_of(self, tenant: str) -> int:
        return self.backend.coordinator.shard_of_tenant(tenant)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Any]]:
    from ray import serve

    from recallserve.deployments.memory import bind_memory

    with small_memory_ray(tmp_path_factory.mktemp("memory"), RAY_DIR) as config:
        _, (generation,) = bind_memory(config)
        embedder, shards = generation["embedder"], generation["shards"]
        probe = serve.deployment(LiveProbe, name="probe", ray_actor_options={"num_cpus": 0.1})
        handle = serve.run(probe.bind(embedder, shards, config.memory.model_dump(mode="json")), name=APP, route_prefix=None)
        yield config, handle


def _job_args(module: Any, argv: list[str]) -> argparse.Namespace:
    from recallserve.deployments.jobs._args import add_common_arguments

    p = argparse.ArgumentParser()
    add_common_arguments(p)
    module.add_arguments(p)
    return p.parse_args(argv)


def test_live_sweep_and_consolidate_while_serving(cluster: tuple[Any, Any], tmp_path: Path) -> None:
    import ray

    from recallserve.deployments.jobs import JobError, consolidate, expiry_sweep
    from recallserve.deployments.jobs._live import find_local_cluster

    config, handle = cluster
    # The address discovery `recallserve job ... --live` uses finds this cluster by its temp dir.
    assert find_local_cluster(RAY_DIR) == ray.get_runtime_context().gcs_address

    now = time.time()
    expired, dup_old, dup_new, decayed = {}, {}, {}, {}
    for n, tenant in enumerate(TENANTS):
        items = [{"text": f"{tenant} promo code SPRING{i} is valid for one week only", "source_id": f"promo-{i}",
                  "created_at": now - 7200, "expires_at": now - 3600} for i in range(2)]
        items += [{"text": f"The {tenant} printer on floor {n} jams with thick paper.", "source_id": "printer-a",
                   "created_at": now - 5 * 86400},
                  {"text": f"The {tenant} printer on floor {n} jams with thick paper!", "source_id": "printer-b",
                   "created_at": now - 86400},
                  {"text": f"{tenant} moved its office to building C last spring", "source_id": "office",
                   "created_at": now - 60 * 86400},
                  {"text": f"{tenant} invoices are paid within {30 + n} days by bank transfer", "source_id": "invoices"}]
        # NOTE: filler so that each job takes a few seconds of handle calls while the writer writes.
        rng = random.Random(n)
        items += [{"text": f"{tenant} fact {j}: " + " ".join(rng.sample(WORDS, 8))} for j in range(30)]
        ids = handle.add.remote(tenant, items).result()
        expired[tenant], (dup_old[tenant], dup_new[tenant], decayed[tenant]) = ids[:2], ids[2:5]

    acked: dict[str, tuple[str, str]] = {}
    failures: list[str] = []
    stop = threading.Event()

    def writer() -> None:
        rng = random.Random(7)
        i = 0
        while not stop.is_set():
            tenant = TENANTS[i % len(TENANTS)]
            text = f"{tenant} note {i}: " + " ".join(rng.sample(WORDS, 8))
            # Writes 0, 3, 6, 9 renew an expiring promo (same source id, four distinct tenant/promo
            # pairs): a user's newer write that replaces the record the sweep may be about to delete.
            renew = i % 3 == 0 and i < 12
            item = {"text": text, "source_id": f"promo-{i % 2}" if renew else f"note-{i}"}
            try:
                (rid,) = handle.add.remote(tenant, [item]).result(timeout_s=60)
                acked[rid] = (tenant, text)
            except Exception as exc:  # noqa: BLE001 - recorded; the test fails on any below
                failures.append(repr(exc)[:200])
            i += 1
            time.sleep(0.05)

    t = threading.Thread(target=writer, daemon=True)
    t.start()
    try:
        common = ["--live", "--app", APP, "--data-dir", str(tmp_path), "--no-progress", "--batch-size", "4"]
        with pytest.raises(JobError, match="no Serve application 'nope'"):
            expiry_sweep.run(_job_args(expiry_sweep, common[:1] + ["--app", "nope"] + common[3:]))
        dry = consolidate.run(_job_args(consolidate, common + ["--dry-run"]))
        assert dry.stats["duplicates_deleted"] == len(TENANTS) and dry.checkpoint is None
        swept = expiry_sweep.run(_job_args(expiry_sweep, common))
        merged = consolidate.run(_job_args(consolidate, common))
        time.sleep(0.5)
    finally:
        stop.set()
        t.join(timeout=60)
    assert not failures, failures[:3]
    assert len(acked) >= 5, "the writer made too few writes while the jobs ran"
    assert swept.shards == 2 and merged.shards == 2
    assert swept.stats["demoted"] == len(TENANTS)
    # Expired promos are gone: deleted by the sweep, or replaced first by the writer's renewal.
    assert swept.stats["expired_deleted"] >= 2 * len(TENANTS) - 4
    assert merged.stats["duplicates_deleted"] == len(TENANTS)
    assert Path(tmp_path, ".jobs", f"consolidate-live-{APP}.json").exists()
    for tenant in TENANTS:
        for rid in expired[tenant]:
            assert handle.get.remote(tenant, rid).result() is None, f"expired memory {rid} of {tenant} still there"
        assert handle.get.remote(tenant, dup_old[tenant]).result() is None, f"older duplicate of {tenant} kept"
        assert handle.get.remote(tenant, dup_new[tenant]).result() is not None, f"newer duplicate of {tenant} lost"
        assert handle.get.remote(tenant, decayed[tenant]).result()["metadata"]["tier"] == "archival"
    lost = [rid for rid, (tenant, text) in acked.items() if (handle.get.remote(tenant, rid).result() or {}).get("text") != text]
    assert not lost, f"{len(lost)} of {len(acked)} acknowledged writes lost"
    # Each finished shard was snapshotted by the job.
    for i in range(2):
        assert list(Path(config.memory.data_dir, f"shard-{i}").glob("snap-*")), f"shard {i} has no snapshot"
    # The BM25 index of each shard followed the jobs' deletes and rewrites.
    from ray import serve

    from recallserve.deployments.memory import shard_deployment_name
    from recallserve.memory_shards.shard import record_version

    shard_handles = [serve.get_deployment_handle(shard_deployment_name(i), app_name=APP) for i in range(2)]
    for h in shard_handles:
        stats = h.stats.remote().result()
        assert stats["lexical_docs"] == stats["records"], stats
    # A compare-and-set against a record the user replaced after the read is refused over Ray too.
    tenant = TENANTS[0]
    shard = shard_handles[handle.shard_of.remote(tenant).result()]
    page = shard.page.remote(None, 1000).result()
    old = next(it for it in page if it.record.tenant == tenant and it.record.source_id == "invoices")
    (new_id,) = handle.add.remote(tenant, [{"text": f"{tenant} invoices are now paid within 10 days", "source_id": "invoices"}]).result()
    done = shard.apply.remote({tenant: [old.record.id]}, [old], {old.record.id: record_version(old.record)}).result()
    assert done["conflicts"] == [old.record.id] and not done["deleted"] and not done["upserted"]
    assert handle.get.remote(tenant, old.record.id).result() is None  # not resurrected
    assert handle.get.remote(tenant, new_id).result()["text"] == f"{tenant} invoices are now paid within 10 days"

    # The real entry point in its own process finds the cluster by address and reports (dry run).
    env = {**os.environ, "RAY_ADDRESS": ray.get_runtime_context().gcs_address}
    out = subprocess.run([sys.executable, "-m", "recallserve.deployments.jobs.consolidate", "--live", "--app", APP, "--data-dir",
                          str(tmp_path), "--dry-run", "--json", "--no-progress"], env=env, cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout[out.stdout.index("{"):])
    assert report["dry_run"] and report["shards"] == 2 and report["stats"]["duplicates_deleted"] == 0
    print(f"\n{len(acked)} concurrent writes kept; sweep {swept.stats} in {swept.seconds} s; "
          f"consolidate {merged.stats} in {merged.seconds} s")
