"""In-process check of one hybrid shard's write and search cost with many tenants (issue 43, Deliver 4).

No Ray, no model: the rows are :func:`recallserve.memory_shards.bench.bulk_rows` (the offline seed's rows,
base vectors drawn at random here), written through ``HybridShard.upsert`` (WAL with fsync, row table,
BM25) in batches as ``recallserve bench search-seed`` writes them. Three parts:

1. one tenant of ``--big`` rows in ``--batch`` rows per write: rows/s, and search p50/p95 of that tenant
   (the 100k one-tenant path, which the many-tenant fixes must not slow);
2. ``--tenants`` tenants of 100 rows (same source ids in each, as the seed writes them), then one batch of
   ``--batch`` rows of one new tenant and one of the same size over ``batch / 100`` new tenants: seconds each;
3. search p50/p95 of one 100-row tenant on that shard.

Run it on two checkouts (or before/after a change) in the same session and compare::

    python -m loadtests.shard_tenants --out loadtests/results/shard-tenants-after.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from recallserve.kernels import ScoreParams
from recallserve.memory_shards import MemoryShard
from recallserve.memory_shards.bench import bulk_rows
from recallserve.memory_shards.config import ShardConfig
from recallserve.memory_shards.retrieval.shard import HybridShard

DIM = 384


def _pct(xs: list[float], p: float) -> float:
    return round(float(np.percentile(np.asarray(xs) * 1000, p)), 2)


def _search_ms(shard: HybridShard, base: np.ndarray, tenant: str, n: int, rng: np.random.Generator) -> dict[str, float]:
    """p50/p95 ms of ``n`` hybrid searches (dense + BM25, k 10) of ``tenant``, queries near base vectors."""
    times = []
    params = ScoreParams()
    for i in range(n):
        q = base[i % base.shape[0]] + 0.3 / np.sqrt(DIM) * rng.standard_normal(DIM).astype(np.float32)
        q /= np.linalg.norm(q)
        t0 = time.perf_counter()
        shard.hybrid_search(q, "printer jam tray roller", tenant, 10, 10, params, None)
        times.append(time.perf_counter() - t0)
    return {"p50_ms": _pct(times, 50), "p95_ms": _pct(times, 95)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--big", type=int, default=100_000, help="rows of the one-tenant part (default 100000)")
    ap.add_argument("--tenants", type=int, default=2000, help="tenants of 100 rows in the many-tenant part (default 2000)")
    ap.add_argument("--batch", type=int, default=5000, help="rows per write, as search-seed (default 5000)")
    ap.add_argument("--searches", type=int, default=200, help="searches per p50/p95 (default 200)")
    ap.add_argument("--label", default="", help="name of this run in the output")
    ap.add_argument("--out", type=Path, help="JSON report")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    base = rng.standard_normal((2000, DIM)).astype(np.float32)
    base /= np.linalg.norm(base, axis=1, keepdims=True)
    words = [f"printer jam tray roller toner {i}" for i in range(2000)]
    out: dict = {"label": args.label, "big": args.big, "tenants": args.tenants, "batch": args.batch}
    with tempfile.TemporaryDirectory(prefix="shard-tenants-") as tmp:
        shard = HybridShard(MemoryShard(ShardConfig(model_id="m", dim=DIM, data_dir=str(Path(tmp) / "one"))))
        t0 = time.perf_counter()
        for start in range(0, args.big, args.batch):
            shard.upsert(bulk_rows(min(args.big, start + args.batch), 2000, base, words, "one", "t", 0.2, 0, start))
        secs = time.perf_counter() - t0
        out["one_tenant_write"] = {"rows": args.big, "seconds": round(secs, 2), "rows_per_s": round(args.big / secs)}
        out["one_tenant_search"] = _search_ms(shard, base, "one", args.searches, rng)
        shard.close()
        print(json.dumps(out), flush=True)
        shard = HybridShard(MemoryShard(ShardConfig(model_id="m", dim=DIM, data_dir=str(Path(tmp) / "many"))))
        pending: list = []
        t0 = time.perf_counter()
        for t in range(args.tenants):
            pending += bulk_rows(100, 100, base, words, f"stored-{t}", "t", 0.2, t)
            if len(pending) >= args.batch:
                shard.upsert(pending)
                pending = []
        if pending:
            shard.upsert(pending)
        secs = time.perf_counter() - t0
        out["many_tenants_write"] = {"rows": 100 * args.tenants, "seconds": round(secs, 2),
                                     "rows_per_s": round(100 * args.tenants / secs)}
        one = bulk_rows(args.batch, 100, base, words, "new-one", "t", 0.2, 0)
        many = [r for t in range(args.batch // 100) for r in bulk_rows(100, 100, base, words, f"new-{t}", "t", 0.2, t)]
        for name, batch in (("batch_one_tenant_s", one), ("batch_many_tenants_s", many)):
            t0 = time.perf_counter()
            shard.upsert(batch)
            out[name] = round(time.perf_counter() - t0, 3)
        out["small_tenant_search"] = _search_ms(shard, base, "stored-7", args.searches, rng)
        shard.close()
    print(json.dumps(out), flush=True)
    if args.out:
        args.out.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
