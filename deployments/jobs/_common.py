"""What every maintenance job shares: the checkpoint file, opening shards, the loop (its options,
report and error are in ``_options``).

A job walks the shards of a memory data root (``<data_dir>/shard-<i>``) one at a time and the
records of a shard in id order, in batches. After each batch it applies its changes (unless
``dry_run``) and then writes the checkpoint, so a rerun of the same command after an
interruption resumes after the last finished batch. Every change a job makes is idempotent
(delete what is gone, upsert the same record), so a batch applied but not yet checkpointed when
the process died is simply done again.

Checkpoint file (JSON, written atomically: temp file + rename)::

    {"format": 1, "job": "expiry-sweep", "params": {...}, "done_shards": [0, 1],
     "current": {"shard": 2, "last_id": "9f..."}, "stats": {"seen": 120, ...}, "updated_at": ...}

The params of the first run are kept (e.g. the sweep's ``now``): a resumed run uses them, and a
rerun with different params refuses to mix the two unless ``restart`` is set.

Two loops: :func:`run_shard_job` hands a job the opened ``MemoryShard`` (re-embed reads copies
that way); :func:`run_access_job` hands it a :class:`~recallserve.memory_shards.shard_access.ShardAccess`
(page, compare-and-set apply, neighbours, snapshot), either over the shard folders or, with
:class:`LiveOptions`, over the shard deployments of a running Ray Serve app (``_live``), so the
same per-batch code runs offline and while the cluster serves. A live run checkpoints to
``<data_dir>/.jobs/<job>-live-<app>.json`` by default.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from recallserve.deployments.jobs._live import LiveCluster, connect
from recallserve.deployments.jobs._options import JobError, JobOptions, JobReport, LiveOptions
from recallserve.memory_shards import EmbeddedRecord, MemoryRecord, MemoryShard, ShardConfig
from recallserve.memory_shards.shard_access import LocalShardAccess, ShardAccess, all_records

__all__ = ["Checkpoint", "discover_shards", "open_shard", "run_access_job", "run_shard_job"]

CHECKPOINT_FORMAT = 1


class Checkpoint:
    """The resumable state of one job run; see the module docstring for the file format."""

    def __init__(self, path: Path | None, job: str, params: dict[str, Any], restart: bool) -> None:
        self.path = path
        self.job = job
        self.resumed = False
        self.state: dict[str, Any] = {"format": CHECKPOINT_FORMAT, "job": job, "params": params,
                                      "done_shards": [], "current": None, "stats": {}, "updated_at": None}
        if path is None or restart or not path.exists():
            return
        try:
            old = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise JobError(f"checkpoint: cannot read {path}: {exc}; rerun with --restart") from None
        if old.get("format") != CHECKPOINT_FORMAT or old.get("job") != job:
            raise JobError(f"checkpoint: {path} belongs to job {old.get('job')!r} (format {old.get('format')}); rerun with --restart")
        kept = {k: v for k, v in old["params"].items() if k not in self.sticky_params}
        new = {k: v for k, v in params.items() if k not in self.sticky_params}
        if kept != new:
            raise JobError(f"checkpoint: {path} was written with other options {kept}; rerun with the same options or --restart")
        self.state = old
        self.resumed = True

    #: params chosen at the first start and reused on resume (never compared).
    sticky_params = frozenset({"now"})

    @property
    def params(self) -> dict[str, Any]:
        return self.state["params"]

    @property
    def stats(self) -> dict[str, int]:
        return self.state["stats"]

    def add(self, counts: dict[str, int]) -> None:
        for key, value in counts.items():
            self.stats[key] = self.stats.get(key, 0) + value

    def done(self, shard: int) -> bool:
        return shard in self.state["done_shards"]

    def last_id(self, shard: int) -> str | None:
        cur = self.state["current"]
        return cur["last_id"] if cur and cur["shard"] == shard else None

    def save(self, shard: int, last_id: str | None, finished: bool) -> None:
        """Record progress; atomic (temp file + fsync + rename)."""
        if finished:
            self.state["done_shards"] = sorted(set(self.state["done_shards"]) | {shard})
            self.state["current"] = None
        else:
            self.state["current"] = {"shard": shard, "last_id": last_id}
        self.state["updated_at"] = time.time()
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        with tmp.open("w") as f:
            json.dump(self.state, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(self.path)


def discover_shards(data_dir: Path, num_shards: int | None) -> list[int]:
    """Shard indices to process: ``0..num_shards-1`` or every ``shard-<i>`` folder present.

    Raises:
        JobError: the data root is missing, has no shard folders, or lacks a requested shard.
    """
    if not data_dir.is_dir():
        raise JobError(f"data_dir: {data_dir} is not a folder")
    found = sorted(int(p.name.split("-", 1)[1]) for p in data_dir.glob("shard-*") if p.is_dir() and p.name.split("-", 1)[1].isdigit())
    if num_shards is None:
        if not found:
            raise JobError(f"data_dir: no shard-<i> folders in {data_dir}")
        return found
    missing = [i for i in range(num_shards) if i not in found]
    if missing:
        raise JobError(f"data_dir: {data_dir} lacks shard folders {missing} (num_shards={num_shards})")
    return list(range(num_shards))


@contextlib.contextmanager
def open_shard(data_dir: Path, index: int, model_id: str, dim: int, **options: Any) -> Iterator[MemoryShard]:
    """Open ``data_dir/shard-<index>`` (WAL replayed), closed on exit.

    Raises:
        JobError: the folder is held by a running shard (its LOCK), or model/dim disagree.
    """
    cfg = ShardConfig(shard_id=index, data_dir=str(data_dir / f"shard-{index}"), model_id=model_id, dim=dim, **options)
    try:
        shard = MemoryShard(cfg)
    except RuntimeError as exc:
        if "already open" in str(exc):
            raise JobError(f"shard {index}: {exc}; stop the cluster's shards (or use a job that reads a copy)") from None
        raise JobError(f"shard {index}: {exc}") from None
    try:
        yield shard
    finally:
        shard.close()


BatchFn = Callable[[MemoryShard, Sequence[MemoryRecord], bool], dict[str, int]]


def run_shard_job(
    job: str,
    opts: JobOptions,
    params: dict[str, Any],
    process_batch: Callable[[dict[str, Any]], BatchFn],
    *,
    after_shard: Callable[[int, MemoryShard, bool], None] | None = None,
    shard_options: dict[str, Any] | None = None,
) -> JobReport:
    """Walk every shard's records in id order, in batches, with checkpoints and progress.

    Args:
        job: job name (checkpoint file name and report).
        opts: common options.
        params: the job's own options; stored in the checkpoint (``now`` is sticky).
        process_batch: given the effective params, returns ``fn(shard, records, dry_run) ->
            counters``; it applies the batch's changes unless ``dry_run``.
        after_shard: called once a shard is finished (e.g. to snapshot), with ``dry_run``.
        shard_options: extra :class:`ShardConfig` fields when opening shards.
    """
    start = time.monotonic()
    ckpt_path = None if opts.dry_run else (opts.checkpoint or opts.data_dir / ".jobs" / f"{job}.json")
    ckpt = Checkpoint(ckpt_path, job, params, restart=opts.restart)
    fn = process_batch(ckpt.params)
    shards = discover_shards(opts.data_dir, opts.num_shards)
    for index in shards:
        if ckpt.done(index):
            continue
        with open_shard(opts.data_dir, index, opts.model_id, opts.dim, **(shard_options or {})) as shard:
            records = all_records(shard)
            after = ckpt.last_id(index)
            todo = [r for r in records if after is None or r.id > after]
            bar = _progress(len(records), len(records) - len(todo), f"{job} shard {index}", opts.progress)
            for i in range(0, len(todo), opts.batch_size):
                batch = todo[i : i + opts.batch_size]
                counts = fn(shard, batch, opts.dry_run)
                ckpt.add({"seen": len(batch), **counts})
                if not opts.dry_run:
                    ckpt.save(index, batch[-1].id, finished=False)
                bar.update(len(batch))
            bar.close()
            if after_shard is not None:
                after_shard(index, shard, opts.dry_run)
            if not opts.dry_run:
                ckpt.save(index, None, finished=True)
    return JobReport(job=job, dry_run=opts.dry_run, resumed=ckpt.resumed, shards=len(shards), stats=dict(ckpt.stats),
                     seconds=round(time.monotonic() - start, 3), checkpoint=None if ckpt_path is None else str(ckpt_path))


AccessBatchFn = Callable[[ShardAccess, Sequence[EmbeddedRecord], bool], dict[str, int]]


def run_access_job(
    job: str,
    opts: JobOptions,
    params: dict[str, Any],
    process_batch: Callable[[dict[str, Any]], AccessBatchFn],
    *,
    live: LiveOptions | None = None,
    cluster: LiveCluster | None = None,
    after_shard: Callable[[int], None] | None = None,
) -> JobReport:
    """Page through every shard's records in id order through :class:`ShardAccess`, with checkpoints.

    Each page of ``opts.batch_size`` records (with vectors) goes to ``fn(access, batch, dry_run)``,
    which applies its changes with ``access.apply`` (compare-and-set) unless ``dry_run``; after
    the batch the checkpoint records its last id. A finished shard is snapshotted (not in a dry run).

    Args:
        job: job name (checkpoint file name and report).
        opts: common options (``data_dir`` holds the default checkpoint; in live mode
            ``model_id``/``dim`` are the deployments' business).
        params: the job's own options; stored in the checkpoint (``now`` is sticky).
        process_batch: given the effective params, returns the batch function.
        live: work through the shard deployments of a running app instead of the folders.
        cluster: an already connected :class:`~recallserve.deployments.jobs._live.LiveCluster` to use with ``live`` (not closed here).
        after_shard: called with the index of each shard finished in this run (not in a dry run).

    Raises:
        JobError: no shards, a shard folder held by a cluster (folder mode), no cluster or app
            (live mode), a foreign checkpoint.
    """
    start = time.monotonic()
    default_name = f"{job}.json" if live is None else f"{job}-live-{live.app}.json"
    ckpt_path = None if opts.dry_run else (opts.checkpoint or opts.data_dir / ".jobs" / default_name)
    ckpt = Checkpoint(ckpt_path, job, params, restart=opts.restart)
    fn = process_batch(ckpt.params)
    with contextlib.ExitStack() as stack:
        scope: Callable[[int], contextlib.AbstractContextManager[ShardAccess]]
        if live is None:
            indices = discover_shards(opts.data_dir, opts.num_shards)
            scope = functools.partial(_local_scope, opts)
        else:
            if cluster is None:
                cluster = stack.enter_context(connect(live))
            indices = cluster.shard_indices(opts.num_shards)
            scope = functools.partial(cluster.shard, generation=live.generation)
        for index in indices:
            if ckpt.done(index):
                continue
            with scope(index) as access:
                _walk_shard(job, opts, ckpt, index, access, fn)
            if after_shard is not None and not opts.dry_run:
                after_shard(index)
    return JobReport(job=job, dry_run=opts.dry_run, resumed=ckpt.resumed, shards=len(indices), stats=dict(ckpt.stats),
                     seconds=round(time.monotonic() - start, 3), checkpoint=None if ckpt_path is None else str(ckpt_path))


@contextlib.contextmanager
def _local_scope(opts: JobOptions, index: int) -> Iterator[ShardAccess]:
    with open_shard(opts.data_dir, index, opts.model_id, opts.dim) as shard:
        yield LocalShardAccess(shard)


def _walk_shard(job: str, opts: JobOptions, ckpt: Checkpoint, index: int, access: ShardAccess, fn: AccessBatchFn) -> None:
    after = ckpt.last_id(index)
    # NOTE: a resumed shard's bar has no total: how many ids precede the checkpoint is unknown.
    bar = _progress(access.count() if after is None else None, 0, f"{job} shard {index}", opts.progress)
    while True:
        batch = access.page(after, opts.batch_size)
        if not batch:
            break
        counts = fn(access, batch, opts.dry_run)
        ckpt.add({"seen": len(batch), **counts})
        after = batch[-1].record.id
        if not opts.dry_run:
            ckpt.save(index, after, finished=False)
        bar.update(len(batch))
    bar.close()
    if not opts.dry_run:
        access.snapshot()
        ckpt.save(index, None, finished=True)


def _progress(total: int | None, initial: int, desc: str, enabled: bool):  # type: ignore[no-untyped-def]
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, desc=desc, unit="rec", disable=not enabled, leave=False)
