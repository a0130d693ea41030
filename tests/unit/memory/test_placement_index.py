"""``memory.placement.exact_max_rows`` (and the IVF knobs) flow from a profile into every shard the
cluster starts: above the limit the shard's searches are answered from IVF (issue 15)."""

from __future__ import annotations

import asyncio

import pytest

from recallserve.deployments.config import ConfigError, load_config
from recallserve.memory_shards import ScoreParams

from .conftest import DIM, MODEL, NOW, make_items, unit


def _shard_deployment(tmp_path, placement: dict):
    from recallserve.deployments.memory import MemoryShardDeployment

    cfg = load_config("cpu-local", overrides={"memory": {"placement": placement}})
    return MemoryShardDeployment(0, str(tmp_path), MODEL, DIM, placement=cfg.memory.placement.model_dump(mode="json"))


def test_profile_exact_max_rows_switches_the_started_shard_to_ivf(tmp_path, rng) -> None:
    ivf = _shard_deployment(tmp_path / "ivf", {"exact_max_rows": 100, "ivf_nlist": 8, "ivf_nprobe": 8,
                                               "ivf_candidates": 64})
    exact = _shard_deployment(tmp_path / "exact", {})
    items = make_items(rng, 400, ["a", "b"])
    q = unit(rng, 4)
    p = ScoreParams(decay="none", threshold=0.2)

    async def run() -> None:
        for dep in (ivf, exact):
            await dep.upsert(items)
            await dep.search(q, "a", 10, p, None, NOW, False)  # the first search starts IVF training
        assert ivf._shard.shard.wait_index(60)
        assert (await ivf.stats())["index"] == "ivf" and ivf._shard.shard.config.exact_max_rows == 100
        assert (await exact.stats())["index"] == "exact"
        want = await exact.search(q, "a", 10, p, None, NOW, False)
        got = await ivf.search(q, "a", 10, p, None, NOW, False)
        # NOTE: every list probed and no decay: the IVF candidates re-scored give the exact top 10.
        assert [[h.record.id for h in hs] for hs in got] == [[h.record.id for h in hs] for hs in want]

    asyncio.run(run())


def test_placement_index_fields_are_checked() -> None:
    with pytest.raises(ConfigError, match="exact_max_rows"):
        load_config("cpu-local", overrides={"memory": {"placement": {"exact_max_rows": -1}}})
    with pytest.raises(ConfigError, match="ivf_nlist"):
        load_config("cpu-local", overrides={"memory": {"placement": {"ivf_nlist": 0}}})
