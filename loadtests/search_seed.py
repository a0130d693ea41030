"""Offline bulk seed for ``recallserve bench search``: N memories written into the shard folders before ``up``.

Seeding through ``POST /v1/memories`` embeds every text with MiniLM on the CPU: ~35-60 memories/s
on 2 shared cores, so 100k memories would take 30-50 minutes. This job writes the same kind of
rows straight into the shards' own write path (``HybridShard.upsert``: WAL, table, BM25), routed
by the real coordinator to the tenant's shard, then snapshots each shard and releases its folder;
``recallserve up`` on the same config then serves them (the bench finds its tag and skips API
seeding), and every search still goes through the Ray proxy, the ingress, the embedder and the
shards.

What differs from API seeding, and why it does not change what a search costs:

* texts: ``--distinct`` base texts from the bench's generator (default 2,000); row ``i`` is base
  ``i mod distinct`` under its own ticket number (``Ticket T-<10000+i>: ...``), its own id and
  source id ``bench-search-<tag>-<i>``;
* vectors: MiniLM embeddings of the base texts (real, same model as the cluster); row ``i`` gets
  ``normalise(v[i mod distinct] + sigma * g / sqrt(D))``, ``g ~ N(0, I)`` (sigma 0.2: cosine ~0.98
  to its base), so the dense scan sees 100k distinct unit rows in MiniLM's space and the BM25 index
  100k documents with the bench's vocabulary.

Example (the cluster must not be running on that folder; the shards' folder lock refuses it)::

    python -m loadtests.search_seed --config /tmp/s/profile.yaml --memories 100000
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from pathlib import Path

import numpy as np

__all__ = ["bulk_rows", "main"]


def bulk_rows(n: int, distinct: int, base_vectors: np.ndarray, base_words: list[str], tenant: str, tag: str,
              sigma: float, seed: int, start: int = 0):
    """Rows ``start .. n-1`` as ``EmbeddedRecord`` s (see the module docstring), in order."""
    from recallserve.memory_shards.records import EmbeddedRecord, MemoryRecord, private_record_id

    rng = np.random.default_rng(seed + start)
    dim = base_vectors.shape[1]
    idx = np.arange(start, n) % distinct
    vecs = base_vectors[idx] + (sigma / np.sqrt(dim)) * rng.standard_normal((n - start, dim)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    now = time.time()
    out = []
    for row, i in enumerate(range(start, n)):
        rec = MemoryRecord(id=private_record_id(), tenant=tenant, source_id=f"bench-search-{tag}-{i}",
                           text=f"Ticket T-{10_000 + i}: {base_words[idx[row]]}.", topic_path="bench/search",
                           created_at=now)
        out.append(EmbeddedRecord(rec, vecs[row]))
    return out


def main(argv: list[str] | None = None) -> int:
    """Parse, embed the base texts, write the rows shard by shard, snapshot, print the figures."""
    p = argparse.ArgumentParser(prog="python -m loadtests.search_seed", description=__doc__.split("\n")[0])
    p.add_argument("--config", type=Path, required=True, help="the profile YAML the cluster will start with")
    p.add_argument("--memories", type=int, default=100_000, help="rows to write (1000-1000000)")
    p.add_argument("--tenant", default="local", help="tenant of the bench's API key (cpu-local: local)")
    p.add_argument("--tag", default="v1", help="the bench's --tag (names the source ids)")
    p.add_argument("--distinct", type=int, default=2000, help="base texts embedded with MiniLM (100-100000)")
    p.add_argument("--sigma", type=float, default=0.2, help="noise added to a base vector (0-1)")
    p.add_argument("--batch", type=int, default=5000, help="rows per shard write (100-50000)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if not 1000 <= args.memories <= 1_000_000 or not 100 <= args.distinct <= min(args.memories, 100_000):
        p.error("--memories must be within [1000, 1000000] and --distinct within [100, min(memories, 100000)]")
    if not 0 <= args.sigma <= 1 or not 100 <= args.batch <= 50_000:
        p.error("--sigma must be within [0, 1] and --batch within [100, 50000]")

    from recallserve.deployments.cli._bench_search import _text
    from recallserve.deployments.config import load_config
    from recallserve.memory_shards.embedders import build_embedder, embedder_identity
    from recallserve.memory_shards.retrieval import local_hybrid_coordinator

    config = load_config(path=args.config)
    model_id, dim = embedder_identity(config.embedder.model)
    rng = random.Random(args.seed)
    # NOTE: the words after "Ticket T-<n>: " and before the final "." of the bench's own texts.
    base_words = [_text(rng, i).split(": ", 1)[1][:-1] for i in range(args.distinct)]
    t0 = time.perf_counter()
    embedder = build_embedder(config.embedder.model, device="cpu", batch_size=config.embedder.forward_batch_size,
                              torch_threads=config.embedder.threads)
    base_vectors = np.asarray(embedder.embed(base_words), dtype=np.float32)
    t_embed = time.perf_counter() - t0
    data_root = Path(config.memory.data_dir).expanduser().resolve()
    coord = local_hybrid_coordinator(config.memory.num_shards, model_id, dim, data_root=data_root,
                                     **config.memory.placement.model_dump())
    t1 = time.perf_counter()
    try:
        for start in range(0, args.memories, args.batch):
            rows = bulk_rows(min(args.memories, start + args.batch), args.distinct, base_vectors, base_words,
                             args.tenant, args.tag, args.sigma, args.seed, start)
            asyncio.run(coord.upsert(rows))
        t_write = time.perf_counter() - t1
        for client in coord.shards:
            client.shard.snapshot()
    finally:
        for client in coord.shards:
            client.shard.close()
    t_total = time.perf_counter() - t0
    print(f"seeded {args.memories} memories of tenant {args.tenant!r} (tag {args.tag}) into {data_root}: "
          f"{args.distinct} base texts embedded in {t_embed:.1f} s, rows written in {t_write:.1f} s "
          f"({args.memories / t_write:.0f}/s), {t_total:.1f} s with the snapshots", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
