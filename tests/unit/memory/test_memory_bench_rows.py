"""``recallserve.memory_shards.bench.bulk_rows``: the rows the offline seed and the shard benches write (no model: base vectors are given)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np

from recallserve.memory_shards.bench import bulk_rows
from recallserve.memory_shards import HashingEmbedder
from recallserve.memory_shards.retrieval import local_hybrid_coordinator


def test_bulk_rows_are_unit_vectors_near_their_base_with_the_bench_source_ids(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    base = rng.standard_normal((10, 384)).astype(np.float32)
    base /= np.linalg.norm(base, axis=1, keepdims=True)
    words = [f"printer jam {i}" for i in range(10)]
    rows = bulk_rows(25, 10, base, words, "local", "t1", 0.2, 0, start=5)
    assert [r.record.source_id for r in rows] == [f"bench-search-t1-{i}" for i in range(5, 25)]
    assert rows[0].record.text == "Ticket T-10005: printer jam 5." and rows[0].record.tenant == "local"
    v = np.stack([r.vectors[0] for r in rows])
    assert np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    cos = np.einsum("ij,ij->i", v, base[np.arange(5, 25) % 10])
    assert cos.min() > 0.9 and cos.max() < 0.9999  # near its base, yet a distinct row
    assert len({r.record.id for r in rows}) == 20

    # written through the coordinator, the bench's last source id is found as the bench looks for it
    emb = HashingEmbedder(384)
    coord = local_hybrid_coordinator(2, emb.model_id, emb.dim, data_root=tmp_path)
    try:
        asyncio.run(coord.upsert(rows))
        found = asyncio.run(coord.list_by_source("local", "bench-search-t1-24"))
        assert [r.text for r in found] == ["Ticket T-10024: printer jam 4."]
    finally:
        for client in coord.shards:
            client.shard.close()
