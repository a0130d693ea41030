"""``recallserve bench search-seed``: the tenant of ``bench search`` written into the shard folders before ``up``.

Seeding through ``POST /v1/memories`` embeds every text with MiniLM on the CPU: ~35-60 memories/s
on 2 shared cores, so 100k memories would take 30-50 minutes. This writes the same kind of rows
straight into the shards' own write path (``HybridShard.upsert``: WAL, table, BM25), routed by the
real coordinator to the tenant's shard, then snapshots each shard and releases its folder;
``recallserve up`` on the same config then serves them (``bench search`` finds its tag and skips
API seeding), and every search still goes through the Ray proxy, the ingress, the embedder and
the shards.

What differs from API seeding, and why it does not change what a search costs
(:func:`recallserve.memory_shards.bench.bulk_rows`): ``--distinct`` base texts from the bench's
generator, row ``i`` is base ``i mod distinct`` under its own ticket number, id and source id
``bench-search-<tag>-<i>``; vectors are MiniLM embeddings of the base texts plus noise (sigma 0.2:
cosine ~0.98 to its base), so the dense scan sees distinct unit rows in MiniLM's space and the
BM25 index documents with the bench's vocabulary.

Example (the cluster must not be running on that folder; the shards' folder lock refuses it)::

    recallserve bench search-seed --config /tmp/s/profile.yaml --memories 100000
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from pathlib import Path

from recallserve.deployments.cli import UserError
from recallserve.deployments.cli._bench_args import check_range

NAME = "search-seed"


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register ``bench search-seed``."""
    p = subparsers.add_parser(NAME, help="write bench search's tenant into a stopped cluster's shard folders")
    p.add_argument("--config", type=Path, required=True, help="the profile YAML the cluster will start with")
    p.add_argument("--memories", type=int, default=100_000,
                   help="rows per tenant, 1000-1000000 (50-1000000 with --tenants; at most 1,000,000 in all; default: 100000)")
    p.add_argument("--tenant", default="local", help="tenant of the bench's API key (cpu-local: local)")
    p.add_argument("--tenants", type=int, default=1,
                   help="tenants written, 1-100000: --tenant and TENANT-other-<i> for the rest, --memories each "
                        "(many small tenants beside the one the bench searches; default: 1)")
    p.add_argument("--tag", default="v1", help="bench search's --tag (names the source ids; default: v1)")
    p.add_argument("--distinct", type=int, default=2000,
                   help="base texts embedded with the profile's embedder, 100-100000, at most --memories used (default: 2000)")
    p.add_argument("--sigma", type=float, default=0.2, help="noise added to a base vector, 0-1 (default: 0.2)")
    p.add_argument("--batch", type=int, default=5000, help="rows per shard write, 100-50000 (default: 5000)")
    p.add_argument("--seed", type=int, default=0, help="random seed of texts and noise (default: 0)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Embed the base texts, write the rows shard by shard, snapshot, print the figures."""
    import numpy as np

    from recallserve.deployments.config import ConfigError, load_config
    from recallserve.memory_shards.bench import bulk_rows, ticket_text
    from recallserve.memory_shards.embedders import build_embedder, embedder_identity
    from recallserve.memory_shards.retrieval import local_hybrid_coordinator

    check_range("tenants", args.tenants, 1, 100_000)
    check_range("memories", args.memories, 1000 if args.tenants == 1 else 50, 1_000_000)
    total = args.memories * args.tenants
    if total > 1_000_000:
        raise UserError(f"--memories x --tenants: {total} rows, at most 1000000")
    check_range("distinct", args.distinct, 100, 100_000)
    # NOTE: row i uses base text i mod distinct, so texts beyond --memories would never be used.
    distinct = min(args.distinct, args.memories)
    check_range("sigma", args.sigma, 0, 1)
    check_range("batch", args.batch, 100, 50_000)
    try:
        config = load_config(path=args.config)
    except ConfigError as exc:
        raise UserError(f"--config: {exc}") from None
    model_id, dim = embedder_identity(config.embedder.model)
    rng = random.Random(args.seed)
    # NOTE: the words after "Ticket T-<n>: " and before the final "." of the bench's own texts.
    base_words = [ticket_text(rng, i).split(": ", 1)[1][:-1] for i in range(distinct)]
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
        pending: list = []
        for t in range(args.tenants):
            tenant = args.tenant if t == 0 else f"{args.tenant}-other-{t}"
            for start in range(0, args.memories, args.batch):
                pending += bulk_rows(min(args.memories, start + args.batch), distinct, base_vectors, base_words,
                                     tenant, args.tag, args.sigma, args.seed + t, start)
                if len(pending) >= args.batch:
                    asyncio.run(coord.upsert(pending))
                    pending = []
        if pending:
            asyncio.run(coord.upsert(pending))
        t_write = time.perf_counter() - t1
        for client in coord.shards:
            client.shard.snapshot()
    finally:
        for client in coord.shards:
            client.shard.close()
    t_total = time.perf_counter() - t0
    who = f"tenant {args.tenant!r}" + (f" and {args.tenants - 1} others" if args.tenants > 1 else "")
    print(f"seeded {args.memories} memories each of {who} (tag {args.tag}) into {data_root}: "
          f"{distinct} base texts embedded in {t_embed:.1f} s, {total} rows written in {t_write:.1f} s "
          f"({total / t_write:.0f}/s), {t_total:.1f} s with the snapshots", flush=True)
    return 0
