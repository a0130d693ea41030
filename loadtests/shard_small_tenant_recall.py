"""Small tenant's recall@10 on an IVF shard against the exact scan (issue 43; in process, no model).

``exact_max_rows`` 20,000 so that 250 tenants x 100 rows (``bulk_rows``, random base vectors) train IVF
lists; 60 queries of three 100-row tenants; top-10 of a plain search against the forced exact scan
(``exact=True``). Run it on two checkouts to compare::

    python loadtests/shard_small_tenant_recall.py after
"""

from __future__ import annotations

import sys

import numpy as np

from recallserve.kernels import ScoreParams
from recallserve.memory_shards import MemoryShard
from recallserve.memory_shards.bench import bulk_rows
from recallserve.memory_shards.config import ShardConfig

DIM = 384


def main(label: str) -> None:
    rng = np.random.default_rng(0)
    base = rng.standard_normal((2000, DIM)).astype(np.float32)
    base /= np.linalg.norm(base, axis=1, keepdims=True)
    words = [f"printer jam {i}" for i in range(2000)]
    shard = MemoryShard(ShardConfig(model_id="m", dim=DIM, exact_max_rows=20_000))
    for c in range(5):
        shard.upsert([r for t in range(50) for r in bulk_rows(100, 100, base, words, f"s-{c}-{t}", "t", 0.2, 50 * c + t)])
    params = ScoreParams(decay="none", threshold=-1.0)
    # NOTE: a first search starts the IVF training (where the code takes IVF for this tenant).
    shard.search(base[:1], "s-0-0", k=10, params=params, touch=False)
    shard.wait_index(120)
    print("stats", {k: shard.stats()[k] for k in ("live_rows", "index", "ivf_state")})
    hit = total = 0
    for tenant in ("s-1-7", "s-3-20", "s-4-49"):
        for i in range(20):
            q = base[i] + 0.5 / np.sqrt(DIM) * rng.standard_normal(DIM).astype(np.float32)
            q /= np.linalg.norm(q)
            want = {h.record.id for h in shard.search(q, tenant, k=10, params=params, touch=False, exact=True)[0]}
            got = {h.record.id for h in shard.search(q, tenant, k=10, params=params, touch=False)[0]}
            hit += len(want & got)
            total += len(want)
    print(label, "small-tenant recall@10 vs exact:", round(hit / total, 3), f"({hit}/{total})")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "")
