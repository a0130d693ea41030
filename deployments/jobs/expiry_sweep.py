"""Decay/expiry sweep: delete expired memories, demote decayed ones to the archival tier.

For every record, with ``now`` fixed at the first start (a resumed run keeps it)::

    expired   = expires_at is not None and expires_at <= now              -> deleted
    f         = 1 / (1 + decay_lambda * days),  days = max(0, now - last_access_at) / 86400
    decayed   = f < archive_below  (E-CoT soft decay: 1/(1 + 0.1 d) < 0.3, i.e. d > 23.3 days)
                                                                          -> metadata.tier = "archival"

Demotion rewrites the record with the same vectors (no re-embedding) and keeps its timestamps,
so a later recall (which renews ``last_access_at``) works as before; searches may filter on
``metadata.tier``. Already-archival records are left alone. Each finished shard is snapshotted,
which compacts the deleted rows.

Two ways to reach the shards, one per-batch logic (:func:`recallserve.deployments.jobs.run_access_job`):

* folders (default): opens ``<data_dir>/shard-<i>`` directly; the shards must not be open in a
  running cluster (the shard LOCK refuses it with a clear error);
* ``--live [--app NAME] [--ray-address ADDR]``: while the cluster serves, through the
  ``memory_shard_<i>`` deployments of the app (default the profile's name, as ``recallserve up``
  deploys it). Every delete/demotion is a compare-and-set on the record's content version
  (``recallserve.memory_shards.shard.record_version``, which a recall's last-access renewal does not
  change): a memory a user rewrote or deleted after the job read it is left alone and counted
  under ``conflicts``, so the job never overwrites a newer write; a recall since the read is
  kept (the demoted copy takes the later ``last_access_at``). Memories written after a shard's
  walk passed their id are left to the next run.

Both modes checkpoint after each batch (live: ``<data_dir>/.jobs/expiry-sweep-live-<app>.json``),
resume, show progress, honour ``--dry-run`` and snapshot each finished shard.

Run: ``recallserve job expiry-sweep [--dry-run]``,
``recallserve job expiry-sweep --live`` (next to ``recallserve up``) or
``ray job submit -- python -m recallserve.deployments.jobs.expiry_sweep --live --app recallserve``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from recallserve.deployments.jobs._args import add_live_arguments, live_from_args, options_from_args, run_main
from recallserve.memory_shards import EmbeddedRecord, MemoryRecord

__all__ = ["ARCHIVAL_TIER", "decay_factor", "add_arguments", "run", "sweep", "main"]

ARCHIVAL_TIER = "archival"
JOB = "expiry-sweep"


def decay_factor(last_access_at: float, now: float, decay_lambda: float) -> float:
    """Soft decay ``1 / (1 + lambda * days)`` with ``days = max(0, now - last_access_at) / 86400``."""
    days = max(0.0, now - last_access_at) / 86400.0
    return 1.0 / (1.0 + decay_lambda * days)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The sweep's own flags (and ``--live``/``--app``/``--ray-address``)."""
    add_live_arguments(p)
    p.add_argument("--archive-below", type=float, default=0.3, help="demote when the decay factor is below this (0 disables)")
    p.add_argument("--decay-lambda", type=float, default=0.1, help="lambda of the decay 1/(1 + lambda * days)")
    p.add_argument("--now", type=float, default=None, help="epoch seconds used as now (default: the time of the first start)")
    p.add_argument("--keep-expired", action="store_true", help="do not delete expired records (demotion only)")


def sweep(opts: Any, *, archive_below: float = 0.3, decay_lambda: float = 0.1, now: float | None = None,
          delete_expired: bool = True, live: Any = None, memory_retention_days: dict[str, float] | None = None) -> Any:
    """Run the sweep over every shard; returns a :class:`JobReport`.

    Args:
        opts: :class:`recallserve.deployments.jobs.JobOptions`.
        memory_retention_days: tenant -> days (``auth.retention.<tenant>.memories_days``): a memory
            created more than that before ``now`` is deleted (counted as ``retention_deleted``).
        live: :class:`recallserve.deployments.jobs.LiveOptions` to sweep the running app's shard deployments;
            None sweeps the folders of ``opts.data_dir``.

    Raises:
        ValueError: a bound out of range (names the option).
        JobError: see :func:`recallserve.deployments.jobs.run_access_job`.
    """
    from recallserve.memory_shards.shard import record_version
    from pydantic import ValidationError

    from recallserve.deployments.jobs._common import run_access_job

    if not 0 <= archive_below <= 1:
        raise ValueError(f"archive_below: must be in [0, 1], got {archive_below}")
    if decay_lambda < 0:
        raise ValueError(f"decay_lambda: must be >= 0, got {decay_lambda}")
    params = {"now": time.time() if now is None else float(now), "archive_below": archive_below,
              "decay_lambda": decay_lambda, "delete_expired": delete_expired,
              "retention": dict(memory_retention_days or {})}

    def make(p: dict[str, Any]):  # type: ignore[no-untyped-def]
        cutoff = float(p["now"])

        def batch(shard: Any, items: Sequence[EmbeddedRecord], dry_run: bool) -> dict[str, int]:
            counts = {"expired_deleted": 0, "retention_deleted": 0, "demoted": 0, "already_archival": 0,
                      "demote_failed": 0, "conflicts": 0}
            kept_days: dict[str, float] = p.get("retention", {})
            too_old: set[str] = set()
            deletes: dict[str, list[str]] = defaultdict(list)
            upserts: list[EmbeddedRecord] = []
            expected: dict[str, str] = {}
            for item in items:
                rec = item.record
                days = kept_days.get(rec.tenant)
                if days is not None and rec.created_at < cutoff - days * 86400.0:
                    deletes[rec.tenant].append(rec.id)
                    expected[rec.id] = record_version(rec)
                    too_old.add(rec.id)
                    continue
                if p["delete_expired"] and rec.expires_at is not None and rec.expires_at <= cutoff:
                    deletes[rec.tenant].append(rec.id)
                    expected[rec.id] = record_version(rec)
                    continue
                if p["archive_below"] <= 0:
                    continue
                if rec.metadata.get("tier") == ARCHIVAL_TIER:
                    counts["already_archival"] += 1
                    continue
                if decay_factor(rec.last_access_at or rec.created_at, cutoff, p["decay_lambda"]) >= p["archive_below"]:
                    continue
                try:
                    # NOTE: model_validate (not model_copy) so metadata bounds are checked now,
                    # not at the next WAL replay.
                    demoted = MemoryRecord.model_validate({**rec.model_dump(), "metadata": {**rec.metadata, "tier": ARCHIVAL_TIER}})
                except ValidationError:
                    counts["demote_failed"] += 1
                    continue
                upserts.append(EmbeddedRecord(demoted, item.vectors))
                expected[rec.id] = record_version(rec)
            if dry_run:
                counts["expired_deleted"] = sum(len(ids) for ids in deletes.values()) - len(too_old)
                counts["retention_deleted"] = len(too_old)
                counts["demoted"] = len(upserts)
            elif expected:
                done = shard.apply(deletes, upserts, expected)
                counts["retention_deleted"] = len(too_old.intersection(done["deleted"]))
                counts["expired_deleted"] = len(done["deleted"]) - counts["retention_deleted"]
                counts["demoted"] = len(done["upserted"])
                counts["conflicts"] = len(done["conflicts"])
            return counts

        return batch

    return run_access_job(JOB, opts, params, make, live=live)


def expire_state(state_dir: Any, retention: dict[str, Any], now: float) -> dict[str, int]:
    """Enforce the sessions and traces limits of ``auth.retention`` on the state folder's SQLite files.

    The files may be open by the running state deployment: SQLite in WAL mode takes a second
    process's writes (each delete is one short transaction), so this runs beside the cluster too.
    """
    import asyncio

    from recallserve.serve.context import SessionStore
    from recallserve.serve.traces import TraceStore

    async def go() -> dict[str, int]:
        counts = {"sessions": 0, "messages": 0, "entities": 0, "turns": 0}
        sessions = SessionStore(state_dir / "sessions.sqlite3")
        traces = TraceStore(state_dir / "turns.sqlite3")
        try:
            for tenant, limits in retention.items():
                if limits.sessions_days is not None:
                    for k, v in (await sessions.expire_before(tenant, now - limits.sessions_days * 86400.0)).items():
                        counts[k] += v
                if limits.traces_days is not None:
                    counts["turns"] += (await traces.expire_before(tenant, now - limits.traces_days * 86400.0))["turns"]
        finally:
            sessions.close()
            traces.close()
        return counts

    return asyncio.run(go())


def run(args: argparse.Namespace) -> Any:
    """Entry used by both ``recallserve job expiry-sweep`` and ``python -m``: the memories' expiry,
    decay and retention limits, then the sessions' and traces' retention limits (``auth.retention``)."""
    from recallserve.deployments.config import load_config

    config = load_config(profile=args.profile, path=args.config)
    retention = config.auth.retention
    now = time.time() if args.now is None else float(args.now)
    report = sweep(options_from_args(args), archive_below=args.archive_below, decay_lambda=args.decay_lambda,
                   now=args.now, delete_expired=not args.keep_expired, live=live_from_args(args),
                   memory_retention_days={t: r.memories_days for t, r in retention.items() if r.memories_days})
    if retention and not args.dry_run:
        for key, value in expire_state(config.state_dir, retention, now).items():
            print(f"retention: {key} deleted: {value}")
    return report


def main(argv: list[str] | None = None) -> int:
    return run_main(JOB, add_arguments, run, argv)


if __name__ == "__main__":
    sys.exit(main())
