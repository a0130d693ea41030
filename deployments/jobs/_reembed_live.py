"""``reembed --live``: fill a migration's new generation from the serving one while both serve.

The roll-out (docs/operations.md, "Re-embedding without downtime") deploys a config with ``memory.migration``: the new
generation's embedder and shards run beside the serving ones, and the ingress writes every
change to the serving generation first, then to the new one (``MigratingMemoryService``). What
the serving generation held before that is copied by this job, in two passes per shard:

**fill** walks the serving shard in id order (checkpointed). For each page::

    T = target.lookup(ids)            # read the new generation first,
    S = source.lookup(ids)            # then the serving one: S is at least as new as T
    S[id] is None                     -> skip (deleted since the page; the delete reaches T too)
    T[id] is None                     -> embed S[id] with the new embedder, target.insert_absent
    content(T[id]) != content(S[id])  -> embed S[id], upsert it in T if T[id] is unchanged (CAS)
    otherwise                         -> carry S[id]'s later last access over (touch, never backwards)

  then re-reads the inserted ids in the serving generation: one deleted meanwhile (its delete
  may have reached the new generation before the insert) is deleted from the new generation
  again, by compare-and-set on the inserted version.

**prune** walks the new generation's shard: a record the serving generation no longer holds
(read after the page) is deleted by compare-and-set.

Why the reads are in that order: a user's write reaches the serving generation before the new
one, so the serving copy read *after* the new one is never older than it; writing it into the
new generation at worst lands just before the user's own write there, which replaces it.
"content" is the record without ``last_access_at`` and ``embedding_model``
(:func:`recallserve.memory_shards.records.content_key`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from recallserve.deployments.jobs._live import connect
from recallserve.deployments.jobs._options import JobError, JobReport
from recallserve.memory_shards import EmbeddedRecord, MemoryRecord, embedder_identity
from recallserve.memory_shards.records import content_key
from recallserve.memory_shards.shard import record_version
from recallserve.memory_shards.shard_access import ShardAccess

__all__ = ["EmbedFn", "fill_batch", "prune_batch", "run_live"]

EmbedFn = Callable[[list[str]], np.ndarray]

FILL_JOB = "reembed-fill"
PRUNE_JOB = "reembed-prune"


def _embed(embed: EmbedFn, records: Sequence[MemoryRecord], model_id: str, dim: int) -> list[EmbeddedRecord]:
    """Records with the new embedder's vectors, stamped with its model id."""
    texts = [r.embedding_texts() for r in records]
    flat = [t for group in texts for t in group]
    vectors = np.asarray(embed(flat), dtype=np.float32) if flat else np.zeros((0, dim), np.float32)
    if vectors.shape != (len(flat), dim):
        raise RuntimeError(f"embedder returned shape {vectors.shape} for {len(flat)} texts of dim {dim}")
    out, start = [], 0
    for rec, group in zip(records, texts):
        out.append(EmbeddedRecord(rec.model_copy(update={"embedding_model": model_id}), vectors[start : start + len(group)]))
        start += len(group)
    return out


def _delete_by_version(target: ShardAccess, records: Sequence[MemoryRecord]) -> dict[str, list[str]]:
    """Delete ``records`` from ``target`` if each is still the version given (compare-and-set)."""
    deletes: dict[str, list[str]] = {}
    for rec in records:
        deletes.setdefault(rec.tenant, []).append(rec.id)
    return target.apply(deletes, [], {rec.id: record_version(rec) for rec in records})


def fill_batch(source: ShardAccess, target: ShardAccess, embed: EmbedFn, model_id: str, dim: int,
               batch: Sequence[EmbeddedRecord], dry_run: bool) -> dict[str, int]:
    """One page of the fill pass (see the module docstring); returns counters."""
    ids = [it.record.id for it in batch]
    have = target.lookup(ids)
    now = source.lookup(ids)
    missing: list[MemoryRecord] = []
    changed: list[MemoryRecord] = []
    expected: dict[str, str] = {}
    renew: dict[str, float] = {}
    counts = {"gone": 0, "unchanged": 0}
    for old, cur in zip(have, now):
        if cur is None:
            counts["gone"] += 1
        elif old is None:
            missing.append(cur)
        elif content_key(old) != content_key(cur):
            changed.append(cur)
            expected[cur.id] = record_version(old)
        else:
            counts["unchanged"] += 1
            if (cur.last_access_at or 0.0) > (old.last_access_at or 0.0):
                renew[cur.id] = float(cur.last_access_at or 0.0)
    if dry_run:
        return {**counts, "would_insert": len(missing), "would_update": len(changed), "would_renew": len(renew)}
    items = _embed(embed, missing + changed, model_id, dim)
    inserted_items = items[: len(missing)]
    inserted = set(target.insert_absent(inserted_items))
    counts["inserted"] = len(inserted)
    counts["skipped_newer"] = len(missing) - len(inserted)
    counts["updated"] = counts["conflicts"] = 0
    if changed:
        out = target.apply({}, items[len(missing):], expected)
        counts["updated"], counts["conflicts"] = len(out["upserted"]), len(out["conflicts"])
    # A record deleted from the serving generation after it was read must not live on here.
    mine = [it for it in inserted_items if it.record.id in inserted]
    counts["undone"] = 0
    if mine:
        check = source.lookup([it.record.id for it in mine])
        stale = [it.record for it, cur in zip(mine, check) if cur is None]
        if stale:
            counts["undone"] = len(_delete_by_version(target, stale)["deleted"])
    if renew:
        target.touch(list(renew), list(renew.values()))
    counts["renewed"] = len(renew)
    return counts


def prune_batch(source: ShardAccess, target: ShardAccess, batch: Sequence[EmbeddedRecord], dry_run: bool) -> dict[str, int]:
    """One page of the prune pass over the new generation: drop what the serving one no longer holds."""
    now = source.lookup([it.record.id for it in batch])
    stale = [it.record for it, cur in zip(batch, now) if cur is None]
    if dry_run or not stale:
        return {"would_prune" if dry_run else "pruned": len(stale)}
    out = _delete_by_version(target, stale)
    return {"pruned": len(out["deleted"]), "prune_conflicts": len(out["conflicts"])}


def _check_dual_writes(cluster: Any, app: str, generation: str) -> None:
    """Refuse unless the running ingress writes to both generations (asks it: ``memory_routing``).

    The app is RUNNING (checked on connect), so every ingress replica runs the same config.
    """
    routing = cluster.handle("ingress").memory_routing.remote().result(timeout_s=60)
    m = routing.get("migration")
    if not m or m.get("generation") != generation or m.get("writes") != "both":
        raise JobError(f"app: {app!r} is not writing to both generations for {generation!r} (its memory routing: "
                       f"{routing}); deploy the migration step first")


def run_live(opts: Any, config: Any, live: Any) -> Any:
    """Fill and prune the migration's generation of the running app; returns a JobReport.

    Args:
        opts: ``JobOptions`` (batch size, checkpoint, dry run, restart).
        config: the deployed ``AppConfig``; its ``memory.migration`` names the new generation.
        live: ``LiveOptions`` (cluster address, app).

    Raises:
        JobError: no migration in the config, its deployments missing from the app, or the app
            not RUNNING (a roll-out in progress: not every ingress replica writes both yet).
    """
    from recallserve.deployments.jobs._common import run_access_job

    migration = config.memory.migration
    if migration is None:
        raise JobError("memory.migration: the config has no migration; deploy one that sets memory.migration "
                       "(docs/operations.md, 'Re-embedding without downtime'), then run this job with that config")
    if migration.writes != "both":
        raise JobError("memory.migration.writes: the fill needs writes: both (the old generation still getting every "
                       "write); with writes: target it would copy stale records over newer ones")
    current, target = config.memory.generations(config.embedder)
    model_id, dim = embedder_identity(target.embedder.model)
    started = time.monotonic()
    source_live = live.model_copy(update={"generation": current.name})
    target_live = live.model_copy(update={"generation": target.name})
    with connect(source_live) as cluster:
        missing = [n for n in [target.embedder_deployment, *target.shard_names(config.memory.num_shards)]
                   if n not in cluster.deployments]
        if missing:
            raise JobError(f"app: {live.app!r} lacks the migration's deployments {missing[:3]}; deploy the config with "
                           "memory.migration first and wait until it is RUNNING")
        _check_dual_writes(cluster, live.app, migration.generation)
        embedder = cluster.handle(target.embedder_deployment)

        def embed(texts: list[str]) -> np.ndarray:
            return np.asarray(embedder.embed.remote(texts).result(timeout_s=live.call_timeout_s), dtype=np.float32)

        params = {"source": current.name, "target": target.name, "model_id": model_id}
        base = opts.checkpoint or opts.data_dir / ".jobs" / f"reembed-live-{live.app}-{target.name}.json"

        def fill(_params: dict[str, Any]):  # type: ignore[no-untyped-def]
            return lambda access, batch, dry: fill_batch(access, cluster.access(access.index, target.name), embed,
                                                         model_id, dim, batch, dry)

        def prune(_params: dict[str, Any]):  # type: ignore[no-untyped-def]
            return lambda access, batch, dry: prune_batch(cluster.access(access.index, current.name), access, batch, dry)

        fill_opts = opts.model_copy(update={"checkpoint": base.with_name(base.stem + "-fill.json")})
        prune_opts = opts.model_copy(update={"checkpoint": base.with_name(base.stem + "-prune.json")})
        filled = run_access_job(FILL_JOB, fill_opts, params, fill, live=source_live, cluster=cluster,
                                after_shard=lambda i: cluster.access(i, target.name).snapshot())
        pruned = run_access_job(PRUNE_JOB, prune_opts, params, prune, live=target_live, cluster=cluster)
    # NOTE: the checkpoints only serve to resume an interrupted run; once both passes finished,
    # a rerun (e.g. after a failed dual write) walks everything again.
    for ckpt in (fill_opts.checkpoint, prune_opts.checkpoint):
        if not opts.dry_run:
            ckpt.unlink(missing_ok=True)
    stats = dict(filled.stats)
    stats["seen_target"] = pruned.stats.get("seen", 0)
    for key, value in pruned.stats.items():
        if key != "seen":
            stats[key] = value
    return JobReport(job="reembed", dry_run=opts.dry_run, resumed=filled.resumed or pruned.resumed, shards=filled.shards,
                     stats=stats, seconds=round(time.monotonic() - started, 3), checkpoint=None,
                     extra={"mode": "live", "from": current.name or "(unnamed)", "to": target.name, "model_id": model_id,
                            "next": "deploy migration.reads: target, then writes: target, then make "
                                    f"{target.name!r} the only generation (docs/operations.md, 'Re-embedding without downtime')"})
