"""A device-resident shard on CUDA: Triton on the serving path, same answers as a CPU shard.

Skipped without CUDA; ``scripts/gpu_check.sh`` runs it on a lent GPU machine.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("CUDA is not available", allow_module_level=True)
pytest.importorskip("triton")

from recallserve.memory_shards import EmbeddedRecord, MemoryRecord, MemoryShard, ScoreParams, ShardConfig  # noqa: E402

pytestmark = pytest.mark.gpu
NOW = 1.7e9


def _items(n: int, dim: int, seed: int) -> list[EmbeddedRecord]:
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((8, dim))
    out = []
    for i in range(n):
        v = centres[i % 8] + rng.standard_normal(dim)
        rec = MemoryRecord(tenant=("a", "b", "shared")[i % 3], source_id=f"s{i // 2}", text=f"m{i}",
                           created_at=NOW - 1e6, last_access_at=NOW - float(rng.uniform(0, 60)) * 86_400)
        out.append(EmbeddedRecord(rec, (v / np.linalg.norm(v)).astype(np.float32)[None, :]))
    return out


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_cuda_shard_matches_cpu_shard_through_writes(dtype: str) -> None:
    items = _items(3000, 96, seed=1)
    cpu = MemoryShard(ShardConfig(model_id="m", dim=96))
    gpu = MemoryShard(ShardConfig(model_id="m", dim=96, device="cuda", vector_dtype=dtype))
    q = np.stack([it.vectors[0] for it in items[:6]])
    p = ScoreParams(threshold=0.2)
    for shard in (cpu, gpu):
        shard.upsert(items[:2000])
    gpu.search(q, "a", k=10, params=p, now=NOW, touch=False)  # rows now on the device
    for shard in (cpu, gpu):
        shard.upsert(items[2000:])  # grows past the first capacity
        shard.delete("a", [it.record.id for it in items[:300] if it.record.tenant == "a"])
        shard.touch([it.record.id for it in items[300:400]], NOW)
        shard.flush()
    assert gpu.stats()["kernel"] == "triton" and gpu.stats()["device"].startswith("cuda")
    want = cpu.search(q, ["a", "b"] * 3, k=10, params=p, now=NOW, touch=False)
    got = gpu.search(q, ["a", "b"] * 3, k=10, params=p, now=NOW, touch=False)
    tol = 1e-5 if dtype == "float32" else 2e-3
    for g, w in zip(got, want):
        if dtype == "float32":
            assert [h.record.id for h in g] == [h.record.id for h in w]
        else:  # fp16 rounding may swap near-ties only
            assert len({h.record.id for h in g} & {h.record.id for h in w}) >= len(w) - 1
        for a, b in zip(g, w):
            assert abs(a.score - b.score) < tol
