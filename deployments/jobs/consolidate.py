"""Consolidate near-duplicate memories: per tenant, keep the newest of each group, delete the rest.

For each record ``r`` (in id order, skipping ones already removed in this run), the shard is
searched with ``r``'s main-text vector, restricted to ``r``'s tenant, with no time decay::

    group(r) = {r} + {h : h.tenant == r.tenant, h.kind == r.kind, cos(r, h) >= threshold}
    keep     = newest of the group (max created_at, then max id)
    delete   = group - {keep};  keep.last_access_at renewed to the group's latest access

so the kept memory inherits the most recent use and does not decay faster than its copies.
Shared records are never deleted on a tenant's behalf. NOTE: the default threshold 0.95 cosine
is far above the recall threshold (0.35): only restatements of one fact merge, not related facts.

Like the sweep it runs on the shard folders (the shards must not be open in a running cluster)
or, with ``--live [--app NAME] [--ray-address ADDR]``, through the running app's shard
deployments while they serve (``MemoryShardDeployment.neighbours`` for the search). Each group
is merged by one compare-and-set call with ``all_or_nothing``: if any member (the kept one
included) was rewritten or deleted since it was read, the whole group is skipped and its
records are counted under ``conflicts`` -- a merge never deletes the copy a user just updated,
nor the duplicates of a memory the user just deleted. Checkpoints (live:
``<data_dir>/.jobs/consolidate-live-<app>.json``), resume, progress, ``--dry-run`` and the
snapshot of each finished shard work the same in both modes.

Run: ``recallserve job consolidate [--threshold 0.95] [--dry-run] [--live]`` or
``ray job submit -- python -m recallserve.deployments.jobs.consolidate --live --app recallserve``.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from recallserve.deployments.jobs._args import add_live_arguments, live_from_args, options_from_args, run_main
from recallserve.memory_shards import EmbeddedRecord

__all__ = ["add_arguments", "consolidate", "run", "main"]

JOB = "consolidate"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The consolidation job's own flags (and ``--live``/``--app``/``--ray-address``)."""
    add_live_arguments(p)
    p.add_argument("--threshold", type=float, default=0.95, help="cosine at or above which two memories are duplicates")
    p.add_argument("--neighbours", type=int, default=16, help="candidates examined per record")


def consolidate(opts: Any, *, threshold: float = 0.95, neighbours: int = 16, live: Any = None) -> Any:
    """Merge near-duplicates in every shard; returns a :class:`JobReport`.

    Args:
        opts: :class:`recallserve.deployments.jobs.JobOptions`.
        live: :class:`recallserve.deployments.jobs.LiveOptions` to work through the running app's shard
            deployments; None works on the folders of ``opts.data_dir``.

    Raises:
        ValueError: ``threshold`` outside (0, 1] or ``neighbours`` < 2 (names the option).
    """
    from recallserve.memory_shards.shard import record_version

    from recallserve.deployments.jobs._common import run_access_job

    if not 0 < threshold <= 1:
        raise ValueError(f"threshold: must be in (0, 1], got {threshold}")
    if neighbours < 2:
        raise ValueError(f"neighbours: must be >= 2, got {neighbours}")
    removed: set[str] = set()  # NOTE: per run; makes a dry run count each duplicate once.

    def make(p: dict[str, Any]):  # type: ignore[no-untyped-def]
        def batch(shard: Any, items: Sequence[EmbeddedRecord], dry_run: bool) -> dict[str, int]:
            counts = {"groups": 0, "duplicates_deleted": 0, "conflicts": 0}
            for item in items:
                rec = item.record
                if rec.id in removed:
                    continue
                hits = shard.neighbours(rec.id, p["neighbours"], p["threshold"])
                group = [rec] + [h for h in hits
                                 if h.id != rec.id and h.id not in removed and h.tenant == rec.tenant and h.kind == rec.kind]
                if len(group) < 2:
                    continue
                keep = max(group, key=lambda r: (r.created_at, r.id))
                drop = [r for r in group if r.id != keep.id]
                if not dry_run:
                    by_tenant: dict[str, list[str]] = defaultdict(list)
                    for r in drop:
                        by_tenant[r.tenant].append(r.id)
                    latest = max((r.last_access_at or r.created_at) for r in group)
                    done = shard.apply(by_tenant, [], {r.id: record_version(r) for r in group}, {keep.id: latest},
                                       all_or_nothing=True)
                    if done["conflicts"]:
                        counts["conflicts"] += len(done["conflicts"])
                        continue
                    drop = [r for r in drop if r.id in set(done["deleted"])]
                counts["groups"] += 1
                counts["duplicates_deleted"] += len(drop)
                removed.update(r.id for r in drop)
            return counts

        return batch

    return run_access_job(JOB, opts, {"threshold": threshold, "neighbours": neighbours}, make, live=live)


def run(args: argparse.Namespace) -> Any:
    """Entry used by both ``recallserve job consolidate`` and ``python -m``."""
    return consolidate(options_from_args(args), threshold=args.threshold, neighbours=args.neighbours,
                       live=live_from_args(args))


def main(argv: list[str] | None = None) -> int:
    return run_main(JOB, add_arguments, run, argv)


if __name__ == "__main__":
    sys.exit(main())
