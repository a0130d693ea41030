"""``bind_memory`` turns config into bound deployments (no Ray cluster is started here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from recallserve.deployments.config import load_config
from recallserve.deployments.memory import bind_memory


def test_bind_memory_uses_config_options_and_absolute_folders() -> None:
    cfg = load_config("cpu-local", overrides={
        "memory": {"num_shards": 3, "data_dir": "rel/mem", "deployment": {"num_cpus": 0.2},
                   "placement": {"vector_dtype": "float16", "exact_max_rows": 50_000}},
        "embedder": {"max_batch_size": 8, "deployment": {"num_cpus": 0.3, "num_replicas": 2}},
    })
    embedder, generations = bind_memory(cfg)
    assert len(generations) == 1 and generations[0]["embedder"] is embedder
    shards = generations[0]["shards"]
    emb = embedder._bound_deployment
    assert emb.name == "embedder" and emb.num_replicas == 2 and emb.ray_actor_options["num_cpus"] == 0.3
    assert emb.init_args[0]["max_batch_size"] == 8
    assert [s._bound_deployment.name for s in shards] == ["memory_shard_0", "memory_shard_1", "memory_shard_2"]
    for i, s in enumerate(shards):
        dep = s._bound_deployment
        assert dep.ray_actor_options["num_cpus"] == 0.2
        index, data_dir, model_id, dim, placement = dep.init_args
        assert index == i and Path(data_dir).is_absolute() and data_dir.endswith("rel/mem")
        assert (model_id, dim) == ("sentence-transformers/all-MiniLM-L6-v2", 384)
        # The shard's placement reaches its ShardConfig (device, storage dtype, kernel backend, exact/IVF switch).
        assert placement == {"backend": "auto", "gather_max_queries": 256, "device": "cpu", "vector_dtype": "float16",
                             "exact_max_rows": 50_000, "ivf_nlist": 1024, "ivf_nprobe": 32, "ivf_candidates": 512,
                             "ivf_train_sample": 65_536}


def test_a_migration_binds_a_second_generation_with_its_own_embedder(tmp_path: Path) -> None:
    cfg = load_config("cpu-local", overrides={"memory": {
        "num_shards": 2, "data_dir": str(tmp_path / "v1"),
        "migration": {"generation": "v2", "data_dir": str(tmp_path / "v2"), "embedder": {"model": "all-MiniLM-L6-v2-int8"}},
    }})
    shared, (current, target) = bind_memory(cfg)
    assert current["embedder"] is shared
    assert target["embedder"]._bound_deployment.name == "embedder_v2"
    assert target["embedder"]._bound_deployment.init_args[0]["model"] == "all-MiniLM-L6-v2-int8"
    assert [s._bound_deployment.name for s in target["shards"]] == ["memory_shard_v2_0", "memory_shard_v2_1"]
    _, data_dir, model_id, _, _ = target["shards"][1]._bound_deployment.init_args
    assert data_dir == str(tmp_path / "v2") and model_id.endswith("-int8-dynamic")
    # NOTE: the finished migration as the only generation keeps the same deployment names and args,
    # so Ray Serve keeps those replicas running when the config switches over.
    final = load_config("cpu-local", overrides={"memory": {
        "num_shards": 2, "data_dir": str(tmp_path / "v2"), "generation": "v2", "embedder": {"model": "all-MiniLM-L6-v2-int8"},
    }})
    _, (only,) = bind_memory(final)
    assert only["embedder"]._bound_deployment.name == "embedder_v2"
    assert [s._bound_deployment.init_args for s in only["shards"]] == [s._bound_deployment.init_args for s in target["shards"]]


@pytest.mark.parametrize("deployment", [{"num_replicas": 2}, {"autoscaling": {"min_replicas": 1, "max_replicas": 3}},
                                        {"max_surge_percent": 100}])
def test_a_shard_keeps_a_single_writer(deployment: dict) -> None:
    cfg = load_config("cpu-local", overrides={"memory": {"deployment": deployment}})
    with pytest.raises(ValueError, match="single writer"):
        bind_memory(cfg)
