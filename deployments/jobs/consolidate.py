"""Consolidate near-duplicate memories: per tenant, keep the newest of each group, delete the rest.

For each record ``r`` (in id order, skipping ones already removed in this run), the shard is
searched with ``r``'s main-text vector, restricted to ``r``'s tenant, with no time decay::

    group(r) = {r} + {h : h.tenant == r.tenant, h.kind == r.kind, cos(r, h) >= threshold}
    keep     = newest of the group (max created_at, then max id)
    delete   = group - {keep};  keep.last_access_at renewed to the group's latest access

so the kept memory inherits the most recent use and does not decay faster than its copies.
Shared records are never deleted on a tenant's behalf. NOTE: the default threshold 0.95 cosine
is far above the recall threshold (0.35): only restatements of one fact merge, not related facts.

Run: ``recallserve job consolidate [--threshold 0.95] [--dry-run]`` or
``ray job submit -- python -m deployments.jobs.consolidate ...``. Like the sweep it opens shard
folders directly (the shards must not be open in a running cluster).
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

__all__ = ["add_arguments", "consolidate", "run", "main"]

JOB = "consolidate"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The consolidation job's own flags."""
    p.add_argument("--threshold", type=float, default=0.95, help="cosine at or above which two memories are duplicates")
    p.add_argument("--neighbours", type=int, default=16, help="candidates examined per record")


def consolidate(opts: Any, *, threshold: float = 0.95, neighbours: int = 16) -> Any:
    """Merge near-duplicates in every shard of ``opts.data_dir``; returns a :class:`JobReport`.

    Raises:
        ValueError: ``threshold`` outside (0, 1] or ``neighbours`` < 2 (names the option).
    """
    from kernels import ScoreParams
    from memory_shards import MemoryRecord, MemoryShard

    from deployments.jobs._common import run_shard_job
    from deployments.jobs._shard_access import vectors_of

    if not 0 < threshold <= 1:
        raise ValueError(f"threshold: must be in (0, 1], got {threshold}")
    if neighbours < 2:
        raise ValueError(f"neighbours: must be >= 2, got {neighbours}")
    removed: set[str] = set()  # NOTE: per run; makes a dry run count each duplicate once.

    def make(p: dict[str, Any]):  # type: ignore[no-untyped-def]
        params = ScoreParams(decay="none", threshold=p["threshold"])

        def batch(shard: MemoryShard, records: Sequence[MemoryRecord], dry_run: bool) -> dict[str, int]:
            counts = {"groups": 0, "duplicates_deleted": 0}
            for rec in records:
                if rec.id in removed:
                    continue
                vectors = vectors_of(shard, rec.id)
                if vectors is None:
                    continue
                (hits,) = shard.search(vectors[:1], rec.tenant, k=p["neighbours"], params=params, touch=False, exact=True)
                group = [rec] + [h.record for h in hits
                                 if h.record.id != rec.id and h.record.id not in removed
                                 and h.record.tenant == rec.tenant and h.record.kind == rec.kind]
                if len(group) < 2:
                    continue
                keep = max(group, key=lambda r: (r.created_at, r.id))
                drop = [r for r in group if r.id != keep.id]
                counts["groups"] += 1
                counts["duplicates_deleted"] += len(drop)
                removed.update(r.id for r in drop)
                if not dry_run:
                    by_tenant: dict[str, list[str]] = defaultdict(list)
                    for r in drop:
                        by_tenant[r.tenant].append(r.id)
                    for tenant, ids in by_tenant.items():
                        shard.delete(tenant, ids)
                    latest = max((r.last_access_at or r.created_at) for r in group)
                    shard.touch([keep.id], latest)
            if not dry_run:
                shard.flush()
            return counts

        return batch

    def after_shard(index: int, shard: MemoryShard, dry_run: bool) -> None:
        if not dry_run:
            shard.snapshot()

    return run_shard_job(JOB, opts, {"threshold": threshold, "neighbours": neighbours}, make, after_shard=after_shard)


def run(args: argparse.Namespace) -> Any:
    """Entry used by both ``recallserve job consolidate`` and ``python -m``."""
    from deployments.jobs._args import options_from_args

    return consolidate(options_from_args(args), threshold=args.threshold, neighbours=args.neighbours)


def main(argv: list[str] | None = None) -> int:
    from deployments.jobs._args import run_main

    return run_main(add_arguments, run, __doc__.splitlines()[0], argv)


if __name__ == "__main__":
    sys.exit(main())
