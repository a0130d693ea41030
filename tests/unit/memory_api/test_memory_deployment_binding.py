"""``bind_memory`` turns config into bound deployments (no Ray cluster is started here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from deployments.config import load_config
from deployments.memory import bind_memory


def test_bind_memory_uses_config_options_and_absolute_folders() -> None:
    cfg = load_config("cpu-local", overrides={
        "memory": {"num_shards": 3, "data_dir": "rel/mem", "deployment": {"num_cpus": 0.2}},
        "embedder": {"max_batch_size": 8, "deployment": {"num_cpus": 0.3, "num_replicas": 2}},
    })
    embedder, shards = bind_memory(cfg)
    emb = embedder._bound_deployment
    assert emb.name == "embedder" and emb.num_replicas == 2 and emb.ray_actor_options["num_cpus"] == 0.3
    assert emb.init_args[0]["max_batch_size"] == 8
    assert [s._bound_deployment.name for s in shards] == ["memory_shard_0", "memory_shard_1", "memory_shard_2"]
    for i, s in enumerate(shards):
        dep = s._bound_deployment
        assert dep.ray_actor_options["num_cpus"] == 0.2
        index, data_dir = dep.init_args
        assert index == i and Path(data_dir).is_absolute() and data_dir.endswith("rel/mem")


@pytest.mark.parametrize("deployment", [{"num_replicas": 2}, {"autoscaling": {"min_replicas": 1, "max_replicas": 3}}])
def test_a_shard_keeps_a_single_writer(deployment: dict) -> None:
    cfg = load_config("cpu-local", overrides={"memory": {"deployment": deployment}})
    with pytest.raises(ValueError, match="single writer"):
        bind_memory(cfg)
