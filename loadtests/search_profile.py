"""CPU cost of the pieces of one memory search, in process (no Ray): what a search through the cluster must at least pay.

On shared cores wall times follow the neighbours, so every figure here is the calling thread's
CPU time (``time.thread_time``) per operation:

* ``embed_1``: MiniLM embedding of one 4-word query (what each idle search pays the embedder);
* ``embed_16``: per query, when 16 queries share one forward pass (what batching buys);
* ``hybrid_<N>``: one shard's ``hybrid_search`` (dense top-64 + BM25 top-64) over ``N`` rows of
  the tenant, and ``dense_<N>`` without the lexical list;
* ``pickle_kib`` / ``pickle_ms``: the size of that answer and the CPU to pickle and unpickle it
  (what a Ray hop adds for the payload itself).

Rows are built as ``loadtests.search_seed`` builds them (MiniLM vectors of ``--distinct`` bench
texts plus noise), in memory.

Example::

    python -m loadtests.search_profile --rows 2000,100000
"""

from __future__ import annotations

import argparse
import json
import pickle
import random
import time
from collections.abc import Callable

import numpy as np

__all__ = ["main"]


def _cpu_ms(fn: Callable[[], object], repeats: int) -> float:
    start = time.thread_time()
    for _ in range(repeats):
        fn()
    return 1e3 * (time.thread_time() - start) / repeats


def main(argv: list[str] | None = None) -> int:
    """Measure and print one JSON object of CPU ms per operation."""
    p = argparse.ArgumentParser(prog="python -m loadtests.search_profile", description=__doc__.split("\n")[0])
    p.add_argument("--rows", default="2000,100000", help="comma-separated shard sizes (1000-1000000)")
    p.add_argument("--distinct", type=int, default=200, help="base texts embedded for the rows (50-5000)")
    p.add_argument("--repeats", type=int, default=20, help="timed calls per figure (1-1000)")
    args = p.parse_args(argv)
    sizes = [int(x) for x in args.rows.split(",") if x.strip()]
    if not sizes or not all(1000 <= n <= 1_000_000 for n in sizes) or not 50 <= args.distinct <= 5000:
        p.error("--rows: sizes within [1000, 1000000]; --distinct within [50, 5000]")
    if not 1 <= args.repeats <= 1000:
        p.error("--repeats must be within [1, 1000]")

    import ray.cloudpickle as cloudpickle
    import torch

    from recallserve.deployments.cli._bench_search import _WORDS, _text
    from recallserve.kernels import ScoreParams
    from loadtests.search_seed import bulk_rows
    from recallserve.memory_shards.config import ShardConfig
    from recallserve.memory_shards.embedders import build_embedder
    from recallserve.memory_shards.retrieval import HybridShard
    from recallserve.memory_shards.shard import MemoryShard

    torch.set_num_threads(1)
    emb = build_embedder("all-MiniLM-L6-v2", device="cpu", batch_size=16, torch_threads=1)
    rng = random.Random(0)
    queries = [" ".join(rng.choice(_WORDS) for _ in range(4)) for _ in range(max(16, args.repeats))]
    emb.embed(queries[:16])
    out: dict[str, float | int] = {
        "embed_1": _cpu_ms(lambda: emb.embed(queries[:1]), args.repeats),
        "embed_16": _cpu_ms(lambda: emb.embed(queries[:16]), max(1, args.repeats // 4)) / 16,
    }
    words = [_text(rng, i).split(": ", 1)[1][:-1] for i in range(args.distinct)]
    base = np.asarray(emb.embed(words), dtype=np.float32)
    qv = np.asarray(emb.embed(queries), dtype=np.float32)
    params = ScoreParams(threshold=0.35)
    for n in sizes:
        shard = HybridShard(MemoryShard(ShardConfig(shard_id=0, model_id=emb.model_id, dim=emb.dim)))
        for lo in range(0, n, 10_000):
            shard.upsert(bulk_rows(min(n, lo + 10_000), args.distinct, base, words, "local", "profile", 0.2, 0, lo))
        calls = iter(range(10**9))

        def search(lexical: int) -> object:
            i = next(calls) % len(queries)
            return shard.hybrid_search(qv[i], queries[i], "local", 64, lexical, params, None, time.time())

        search(64)
        out[f"hybrid_{n}"] = _cpu_ms(lambda: search(64), args.repeats)
        out[f"dense_{n}"] = _cpu_ms(lambda: search(0), args.repeats)
        answer = search(64)
        blob = cloudpickle.dumps(answer)
        out[f"pickle_kib_{n}"] = round(len(blob) / 1024, 1)
        out[f"pickle_ms_{n}"] = _cpu_ms(lambda: pickle.loads(cloudpickle.dumps(answer)), args.repeats)
        shard.close()
    print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in out.items()}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
